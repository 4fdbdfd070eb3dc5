//! The name API (`register_name`, `unregister_name`, `resolve_name`,
//! `names`, `name_events`): actor names bound to actor addresses, as a
//! thin layer over endpoints.
//!
//! A name binding is the endpoint `(`[`NAME_SERVICE`]`, name)` whose address
//! is the actor address and whose `node` is the owning node; its port is
//! the placeholder [`NAME_PORT`]. Everything else (LWW merge, tombstones,
//! death of the owner, anti-entropy) is the generic machinery.

use futures::stream::{self, BoxStream, StreamExt};
use waypost::{Endpoint, EndpointKey, Event, Registry, Result, Snapshot, Version, Watch};

use crate::registry::GossipRegistry;

/// The service that holds name bindings.
pub const NAME_SERVICE: &str = "actor-names";
/// The port stored in a name binding (endpoints need one).
pub const NAME_PORT: u16 = 1;

/// What a name resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameBinding {
    /// The name.
    pub name: String,
    /// The actor address it resolves to.
    pub actor_addr: String,
    /// The node that owns the binding.
    pub node: String,
}

/// A change of a name binding, as [`GossipRegistry::name_events`] reports
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameEvent {
    /// A name was registered or rebound.
    Registered {
        /// The name.
        name: String,
        /// What it now resolves to.
        actor_addr: String,
        /// The owning node.
        node: String,
    },
    /// A name was unregistered (tombstoned, or its node died).
    Unregistered {
        /// The name.
        name: String,
        /// What it resolved to before.
        previous_addr: String,
    },
}

fn binding(ep: &Endpoint) -> NameBinding {
    NameBinding {
        name: ep.id.clone(),
        actor_addr: ep.address.clone(),
        node: ep.node.clone(),
    }
}

impl GossipRegistry {
    /// Bind `name` to `actor_addr`, owned by this node; gossiped to every
    /// member. Both must be valid endpoint names (no whitespace or control
    /// characters, at most 253 bytes).
    pub async fn register_name(&self, name: &str, actor_addr: &str) -> Result<()> {
        let ep = Endpoint::new(NAME_SERVICE, name, actor_addr, NAME_PORT)
            .with_node(self.node_id().as_str())
            .with_label("kind", "actor-name");
        self.register(ep).await
    }

    /// Remove the binding of `name` (a tombstone, gossiped).
    pub async fn unregister_name(&self, name: &str) -> Result<()> {
        self.deregister(&EndpointKey::new(NAME_SERVICE, name)).await
    }

    /// What `name` resolves to in the local replica (eventually
    /// consistent), if bound.
    pub fn resolve_name(&self, name: &str) -> Option<NameBinding> {
        let key = EndpointKey::new(NAME_SERVICE, name);
        self.with_machine(|m| m.endpoint(&key))
            .map(|ep| binding(&ep))
    }

    /// Every name bound in the local replica.
    pub fn names(&self) -> Vec<NameBinding> {
        self.with_machine(|m| {
            m.endpoints()
                .iter()
                .filter(|e| e.service == NAME_SERVICE)
                .map(binding)
                .collect()
        })
    }

    /// A stream of name events: first one `Registered` per name bound now,
    /// then every change. It follows the registry's watch and resumes it
    /// if the watch is cut off.
    pub fn name_events(&self) -> BoxStream<'static, NameEvent> {
        let source = self.watch(None);
        let reopen = {
            let hub_watch = self.watch_factory();
            move |from: Version| hub_watch(from)
        };
        stream::unfold(
            (source, Snapshot::default(), Vec::<NameEvent>::new(), reopen),
            |(mut source, mut state, mut pending, reopen)| async move {
                loop {
                    if let Some(ev) = pending.pop() {
                        return Some((ev, (source, state, pending, reopen)));
                    }
                    match source.next().await? {
                        Ok(ev) => {
                            let before = state.clone();
                            state.apply(&ev);
                            let mut out = name_changes(&before, &state, &ev);
                            out.reverse();
                            pending = out;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "name watch cut off; resuming");
                            source = reopen(state.version());
                        }
                    }
                }
            },
        )
        .boxed()
    }

    fn watch_factory(&self) -> impl Fn(Version) -> waypost::EventStream + Send + 'static {
        let hub = self.hub();
        move |from| hub.subscribe(Some(from))
    }
}

fn name_changes(before: &Snapshot, after: &Snapshot, ev: &Event) -> Vec<NameEvent> {
    let registered = |e: &Endpoint| NameEvent::Registered {
        name: e.id.clone(),
        actor_addr: e.address.clone(),
        node: e.node.clone(),
    };
    match ev {
        Event::Snapshot(_) => {
            let mut out = Vec::new();
            for e in after.service(NAME_SERVICE) {
                if before.get(&e.key()) != Some(e) {
                    out.push(registered(e));
                }
            }
            for e in before.service(NAME_SERVICE) {
                if !after.contains(&e.key()) {
                    out.push(NameEvent::Unregistered {
                        name: e.id.clone(),
                        previous_addr: e.address.clone(),
                    });
                }
            }
            out
        }
        Event::Added { endpoint, .. } | Event::Updated { endpoint, .. }
            if endpoint.service == NAME_SERVICE =>
        {
            vec![registered(endpoint)]
        }
        Event::Removed { key, .. } if key.service == NAME_SERVICE => before
            .get(key)
            .map(|e| NameEvent::Unregistered {
                name: e.id.clone(),
                previous_addr: e.address.clone(),
            })
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}
