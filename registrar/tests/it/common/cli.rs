//! Running the `registrar` binary's client commands in tests.

use std::time::Duration;

use tokio::io::{BufReader, Lines};
use tokio::process::{ChildStdout, Command};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_registrar");
/// How long one command or one line of output may take.
pub const LIMIT: Duration = Duration::from_secs(30);

/// What a finished command printed, and its exit code.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Run one CLI command to completion (bounded), with `env` set.
pub async fn cli_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = tokio::time::timeout(
        LIMIT,
        Command::new(BIN)
            .args(super::serve_args(args))
            .envs(env.iter().copied())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the command did not finish")
    .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Run one CLI command to completion (bounded).
pub async fn cli(args: &[&str]) -> Out {
    cli_env(args, &[]).await
}

/// The next line of a child's output (bounded).
pub async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(LIMIT, lines.next_line())
        .await
        .expect("no line in time")
        .unwrap()
        .expect("the output ended")
}
