//! The namespace itself: finding it, creating it (an HTTP namespace) when
//! it is missing, and the probe.

use aws_sdk_servicediscovery::operation::create_http_namespace::CreateHttpNamespaceError;
use aws_sdk_servicediscovery::types::{NamespaceType, OperationTargetType};
use waypost::{Error, Result};

use crate::client::{request_id, Client};
use crate::config::NamespaceKind;
use crate::error;

impl Client {
    /// The namespace's id and whether it is a DNS namespace.
    pub(crate) async fn find_namespace(&self) -> Result<Option<(String, bool)>> {
        let target = format!("namespace {}", self.cfg.namespace);
        let mut token = None;
        loop {
            let out = self
                .call("ListNamespaces", &target, |c| {
                    c.list_namespaces().set_next_token(token).send()
                })
                .await?;
            if let Some(ns) = out
                .namespaces()
                .iter()
                .find(|ns| ns.name() == Some(self.cfg.namespace.as_str()))
            {
                let dns = matches!(
                    ns.r#type(),
                    Some(NamespaceType::DnsPrivate | NamespaceType::DnsPublic)
                );
                return Ok(ns.id().map(|id| (id.to_string(), dns)));
            }
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(None),
            }
        }
    }

    /// The namespace's id and whether it is a DNS namespace, created (an
    /// HTTP namespace) when it is missing and `create_namespace` is set.
    pub(crate) async fn resolve_namespace(&self) -> Result<(String, bool)> {
        if let Some(found) = self.find_namespace().await? {
            return Ok(found);
        }
        let target = format!("namespace {}", self.cfg.namespace);
        if !self.cfg.create_namespace {
            return Err(Error::not_found(format!(
                "{target} at {} (creating it is turned off)",
                self.endpoint
            )));
        }
        match self.cfg.namespace_kind {
            NamespaceKind::Http => {}
        }
        let created = self
            .send(|c| {
                c.create_http_namespace()
                    .name(&self.cfg.namespace)
                    .creator_request_id(request_id("ns"))
                    .description("service registry (waypost-cloudmap)")
                    .send()
            })
            .await;
        let op_id = match created {
            Ok(out) => out
                .operation_id()
                .map(str::to_string)
                .ok_or_else(|| error::missing("CreateHttpNamespace", "OperationId", &target))?,
            Err(e) => {
                if let Some(CreateHttpNamespaceError::NamespaceAlreadyExists(exists)) =
                    e.as_service_error()
                {
                    // Another process created it first.
                    if let Some(id) = exists.namespace_id() {
                        return Ok((id.to_string(), false));
                    }
                    return self.find_namespace().await?.ok_or_else(|| {
                        Error::not_found(format!("{target}: reported as existing, but not listed"))
                    });
                }
                return Err(error::from_sdk(
                    e,
                    self.about("CreateHttpNamespace", &target),
                ));
            }
        };
        tracing::info!(namespace = %self.cfg.namespace, operation = %op_id, "creating the Cloud Map namespace");
        // Always waited for: nothing can be registered before it exists.
        let targets = self.wait_operation(&op_id, &target).await?;
        match targets.get(&OperationTargetType::Namespace) {
            Some(id) => Ok((id.clone(), false)),
            None => self
                .find_namespace()
                .await?
                .ok_or_else(|| Error::not_found(format!("{target}: created, but not listed"))),
        }
    }

    /// [`waypost::Registry::probe`]: one `GetNamespace` of the namespace this
    /// registry resolved at connect. Cloud Map has no write that leaves
    /// nothing behind (every write is an operation with a history, and
    /// may create a service), so the probe only reads: it proves that Cloud
    /// Map answers, that the credentials are accepted and may read the
    /// namespace, and that the namespace still exists (`NotFound` when it
    /// was deleted). Costs one API request under the client's rate limit.
    pub(crate) async fn probe(&self) -> Result<()> {
        let target = format!("namespace {} ({})", self.cfg.namespace, self.namespace_id);
        let out = self
            .call("GetNamespace", &target, |c| {
                c.get_namespace().id(&self.namespace_id).send()
            })
            .await?;
        match out.namespace() {
            Some(_) => Ok(()),
            None => Err(error::missing("GetNamespace", "Namespace", &target)),
        }
    }
}
