//! The DynamoDB table definitions of `deploy/`, in moto: the AWS CLI
//! commands of `deploy/README.md` and the CloudFormation template
//! (`deploy/aws/registrar.yaml`) make tables the registrar opens and
//! follows (by their stream with `--dynamodb-sync=auto`), and the
//! template's role carries the permissions of `deploy/aws/iam-policy.json`,
//! the stream's only where it is read.
//!
//! The AWS CLI comes from PyPI (`awscli`; `scripts/test` installs it when
//! missing); without it these tests fail, naming the package.

#![cfg(feature = "dynamodb")]

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use waypost::testing::{eventually, unique};
use waypost_fixtures::MotoServer;

use super::deploy::repo;
use crate::common;

const REGION: &str = "us-east-1";
const CREDS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
];

/// Run `script` with bash, the AWS CLI pointed at `moto`; its stdout.
async fn aws(moto: &MotoServer, script: &str) -> String {
    let found = std::process::Command::new("bash")
        .args(["-c", "command -v aws"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "no `aws` command: install the AWS CLI (`pip install awscli`; scripts/test does \
         when it is missing)"
    );
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .env("AWS_ENDPOINT_URL", moto.url())
            .env("AWS_DEFAULT_REGION", REGION)
            .env("AWS_PAGER", "")
            .envs(CREDS)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the AWS CLI did not finish")
    .unwrap();
    assert!(
        out.status.success(),
        "{script}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `registrar serve` on `table` at `moto` with `extra`, once ready; its
/// stderr so far.
async fn serve_ready(moto: &MotoServer, table: &str, extra: &[&str]) -> (common::Spawned, String) {
    let mut args = vec![
        "--registry-backend=dynamodb",
        "--dynamodb-table",
        table,
        "--aws-region",
        REGION,
        "--aws-endpoint-url",
        moto.url(),
        "--sync-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let server = common::spawn_serve_env(&args, &CREDS).await;
    eventually("the registrar ready on the table", || async {
        (server.readyz().await.0 == 200).then_some(())
    })
    .await;
    let log = server.stderr();
    (server, log)
}

/// The README's fenced block that starts with `start`.
fn readme_block(start: &str) -> String {
    let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
    let at = readme
        .find(&format!("```sh\n{start}"))
        .unwrap_or_else(|| panic!("no block starting with {start:?} in deploy/README.md"));
    let body = &readme[at + "```sh\n".len()..];
    body[..body.find("```").unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_table_is_one_the_registrar_follows_by_its_stream() {
    let moto = MotoServer::start_async().await.unwrap();
    let table = unique("deploy-readme");
    let script = readme_block("aws dynamodb create-table").replace("aether-registry", &table);
    assert!(script.contains("update-time-to-live"), "{script}");
    aws(&moto, &script).await;
    let ttl = aws(
        &moto,
        &format!(
            "aws dynamodb describe-time-to-live --table-name {table} \
             --query TimeToLiveDescription.AttributeName --output text"
        ),
    )
    .await;
    assert_eq!(ttl.trim(), "expires_at");
    let (_server, log) = serve_ready(&moto, &table, &[]).await;
    assert!(log.contains("watching the table's stream"), "{log}");
}

/// A policy document read as JSON from stdin, or as a JSON string holding
/// it as JSON or as a Python literal, printed as JSON.
const AS_JSON: &str = "import ast, json, sys
d = json.load(sys.stdin)
if isinstance(d, str):
    try:
        d = json.loads(d)
    except ValueError:
        d = ast.literal_eval(d)
print(json.dumps(d))";

/// The actions of every statement of a policy document, by `Sid`. A null
/// statement is skipped: CloudFormation drops a list element that is
/// `AWS::NoValue`, and moto keeps it as a null.
fn actions(policy: &Value) -> Vec<(String, BTreeSet<String>)> {
    policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s.is_null())
        .map(|s| {
            let acts = match &s["Action"] {
                Value::String(a) => [a.clone()].into(),
                v => v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
            };
            (s["Sid"].as_str().unwrap_or_default().to_string(), acts)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloudformation_stack_makes_the_table_and_role_each_mode_needs() {
    let moto = MotoServer::start_async().await.unwrap();
    let template = repo().join("deploy/aws/registrar.yaml");
    let json_policy: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/aws/iam-policy.json")).unwrap(),
    )
    .unwrap();
    for mode in ["auto", "changelog"] {
        let table = unique(&format!("deploy-cfn-{mode}"));
        let stack = table.clone();
        aws(
            &moto,
            &format!(
                "aws cloudformation create-stack --stack-name {stack} \
                 --template-body file://{} --capabilities CAPABILITY_IAM \
                 --parameters ParameterKey=TableName,ParameterValue={table} \
                 ParameterKey=SyncMode,ParameterValue={mode} \
                 ParameterKey=OidcProvider,ParameterValue=oidc.eks.{REGION}.amazonaws.com/id/TEST",
                template.display()
            ),
        )
        .await;
        let described = eventually("the stack created", || async {
            let out = aws(
                &moto,
                &format!("aws cloudformation describe-stacks --stack-name {stack}"),
            )
            .await;
            let v: Value = serde_json::from_str(&out).unwrap();
            let stack = v["Stacks"][0].clone();
            let status = stack["StackStatus"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert!(!status.ends_with("FAILED"), "{mode}: {stack}");
            (status == "CREATE_COMPLETE").then_some(stack)
        })
        .await;
        let output = |key: &str| {
            described["Outputs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["OutputKey"] == key)
                .map(|o| o["OutputValue"].as_str().unwrap().to_string())
        };
        assert_eq!(output("StreamArn").is_some(), mode == "auto", "{described}");

        // The role's inline policy: the JSON file's statements, the stream's
        // only with `auto`.
        let role_arn = output("RoleArn").expect("a RoleArn output");
        let role = role_arn.rsplit('/').next().unwrap();
        // (moto answers with the document as a Python literal: made JSON.)
        let out = aws(
            &moto,
            &format!(
                "aws iam get-role-policy --role-name {role} --policy-name registry-table \
                 --query PolicyDocument --output json | python3 -c '{AS_JSON}'"
            ),
        )
        .await;
        let doc: Value = serde_json::from_str(&out).unwrap();
        let mut want = actions(&json_policy);
        if mode != "auto" {
            want.retain(|(sid, _)| sid != "RegistryTableStream");
        }
        assert_eq!(actions(&doc), want, "{mode}: {doc}");

        let extra: &[&str] = if mode == "auto" {
            &[]
        } else {
            &["--dynamodb-sync=changelog"]
        };
        let (_server, log) = serve_ready(&moto, &table, extra).await;
        if mode == "auto" {
            assert!(log.contains("watching the table's stream"), "{log}");
        } else {
            assert!(log.contains("change log"), "{log}");
        }
    }
}
