//! [`StripDataPrefix`]: an SDK interceptor for custom endpoint URLs.

use aws_sdk_servicediscovery::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_servicediscovery::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_servicediscovery::error::BoxError;

/// Removes the `data-` host prefix that the SDK puts in front of the
/// data-plane calls when the endpoint is a custom URL (an emulator, a VPC
/// endpoint), where no `data-` host exists. The Rust SDK has no setting
/// for this (boto3's `inject_host_prefix=False`).
#[derive(Debug)]
pub(crate) struct StripDataPrefix {
    prefixed: String,
    plain: String,
}

impl StripDataPrefix {
    pub(crate) fn new(endpoint_url: &str) -> Option<Self> {
        let (scheme, rest) = endpoint_url.split_once("://")?;
        let authority = rest.split('/').next()?;
        Some(Self {
            prefixed: format!("{scheme}://data-{authority}"),
            plain: format!("{scheme}://{authority}"),
        })
    }
}

impl Intercept for StripDataPrefix {
    fn name(&self) -> &'static str {
        "StripDataPrefix"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> std::result::Result<(), BoxError> {
        let request = context.request_mut();
        if let Some(rest) = request.uri().strip_prefix(&self.prefixed) {
            let uri = format!("{}{rest}", self.plain);
            request.set_uri(uri)?;
        }
        Ok(())
    }
}
