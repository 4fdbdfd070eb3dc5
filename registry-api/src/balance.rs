//! [`WeightedBalance`]: a `tower` service that sends each request to one
//! endpoint of a [`Discovery`], picked at random in proportion to the
//! endpoints' weights (feature `tower`).
//!
//! `tower::balance::p2c` balances by load and ignores weights; this one
//! honours them. Zones and draining are the discovery's: build it with
//! [`Discovery::prefer_zone`] and only the preferred zone's endpoints are
//! there to pick while it holds its floor; a draining endpoint is removed
//! from it, so it is sent nothing new.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use tower::discover::Change;
use tower::{BoxError, Service};

use crate::discover::Discovery;
use crate::model::EndpointKey;
use crate::traffic::pick_weighted;

/// Picks one of a [`Discovery`]'s services for each request, with
/// probability proportional to its endpoint's weight
/// ([`crate::Endpoint::weight`]), and waits for that one to be ready.
///
/// - Changes are taken from the discovery at every `poll_ready`, before
///   the pick: a removed (unhealthy, draining, deregistered) endpoint is
///   never picked after its removal was delivered. Calls already made on
///   it run to their end: their futures own what they need.
/// - With no endpoint, `poll_ready` waits for one. A discovery that ended
///   (or failed) with none left is an error.
/// - A service whose `poll_ready` fails is dropped (and logged) and
///   another is picked.
///
/// Each pick is O(number of endpoints).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use tower::{service_fn, Service, ServiceExt};
/// use waypost::balance::WeightedBalance;
/// use waypost::{discover::discover, memory::MemoryRegistry, Endpoint, Registry};
///
/// let reg = Arc::new(MemoryRegistry::new());
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 8080).with_weight(3)).await?;
/// let client = |ep: &Endpoint| {
///     let id = ep.id.clone();
///     service_fn(move |_req: ()| {
///         let id = id.clone();
///         async move { Ok::<_, std::convert::Infallible>(id) }
///     })
/// };
/// let mut balance = WeightedBalance::new(discover(reg, client).service("api"));
/// let who = balance.ready().await.unwrap().call(()).await.unwrap();
/// assert_eq!(who, "a");
/// # Ok::<(), waypost::Error>(()) });
/// ```
pub struct WeightedBalance<S> {
    discovery: Discovery<S>,
    services: BTreeMap<EndpointKey, S>,
    /// The service picked by the last `poll_ready`, until `call`.
    chosen: Option<EndpointKey>,
    /// The discovery ended: nothing more will come.
    ended: Option<String>,
}

impl<S> WeightedBalance<S> {
    /// Balance over the services of `discovery`.
    pub fn new(discovery: Discovery<S>) -> Self {
        Self {
            discovery,
            services: BTreeMap::new(),
            chosen: None,
            ended: None,
        }
    }

    /// The keys of the endpoints there are to pick from now.
    pub fn keys(&self) -> impl Iterator<Item = &EndpointKey> + '_ {
        self.services.keys()
    }

    /// Take every change the discovery has ready.
    fn update(&mut self, cx: &mut Context<'_>) {
        while self.ended.is_none() {
            match Pin::new(&mut self.discovery).poll_next(cx) {
                Poll::Ready(Some(Ok(Change::Insert(key, svc)))) => {
                    if self.chosen.as_ref() == Some(&key) {
                        self.chosen = None;
                    }
                    self.services.insert(key, svc);
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    if self.chosen.as_ref() == Some(&key) {
                        self.chosen = None;
                    }
                    self.services.remove(&key);
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::warn!(error = %e, "the balancer's discovery failed; keeping the endpoints it has");
                    self.ended = Some(e.to_string());
                }
                Poll::Ready(None) => self.ended = Some("the discovery ended".to_string()),
                Poll::Pending => return,
            }
        }
    }

    /// A key picked by weight.
    fn pick(&self) -> Option<EndpointKey> {
        let keys: Vec<&EndpointKey> = self.services.keys().collect();
        let weights: Vec<u32> = keys
            .iter()
            .map(|k| self.discovery.endpoint(k).map_or(1, |e| e.weight()))
            .collect();
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        if total == 0 {
            return None;
        }
        let at = pick_weighted(&weights, rand::random::<u64>() % total)?;
        keys.get(at).map(|k| (*k).clone())
    }
}

impl<S, Req> Service<Req> for WeightedBalance<S>
where
    S: Service<Req>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.update(cx);
        loop {
            let key = match self.chosen.clone() {
                Some(k) => k,
                None => match self.pick() {
                    Some(k) => {
                        self.chosen = Some(k.clone());
                        k
                    }
                    None => {
                        return match &self.ended {
                            Some(why) => {
                                Poll::Ready(Err(format!("no endpoint to call: {why}").into()))
                            }
                            None => Poll::Pending,
                        };
                    }
                },
            };
            let Some(svc) = self.services.get_mut(&key) else {
                self.chosen = None;
                continue;
            };
            match svc.poll_ready(cx) {
                Poll::Ready(Ok(())) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    let e: BoxError = e.into();
                    tracing::warn!(%key, error = %e, "an endpoint's service failed; dropping it");
                    self.services.remove(&key);
                    self.chosen = None;
                }
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let svc = self
            .chosen
            .take()
            .and_then(|key| self.services.get_mut(&key));
        match svc {
            Some(svc) => svc.call(req).map(|r| r.map_err(Into::into)).boxed(),
            None => futures::future::ready(Err(BoxError::from(
                "WeightedBalance::call without a successful poll_ready",
            )))
            .boxed(),
        }
    }
}

impl<S> fmt::Debug for WeightedBalance<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightedBalance")
            .field("services", &self.services.len())
            .field("chosen", &self.chosen)
            .field("discovery", &self.discovery)
            .finish()
    }
}
