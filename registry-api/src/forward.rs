//! The [`forward!`](crate::forward!) macro, and what its expansion needs.

/// Implement one of [`Registry`](crate::Registry), [`Batch`](crate::Batch),
/// [`Heartbeat`](crate::Heartbeat) or [`Watch`](crate::Watch) for a wrapper
/// by forwarding the named methods to a field (or, with `*`, through
/// `Deref`, as for `Arc<T>`), next to the methods written out in full.
///
/// The generics go in square brackets after `impl`. After `forward to
/// FIELD:` come the names of the methods to forward, then a `;`, then the
/// methods the wrapper writes itself (as in an `#[async_trait]` impl).
/// Every method of the trait must be in one of the two places:
/// `clippy::missing_trait_methods` is denied on the impl, so a method
/// added to a trait fails the lint in every wrapper that neither writes
/// nor names it, instead of quietly running the trait's default (a `probe`
/// that only reads, a `list_shared` that copies).
///
/// ```
/// use std::fmt;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use waypost::{forward, Capabilities, Endpoint, Registry, Result};
///
/// /// Counts registrations, hands everything else on.
/// #[derive(Debug)]
/// struct Counting<R> {
///     inner: R,
///     registered: AtomicU64,
/// }
///
/// impl<R: Registry> fmt::Display for Counting<R> {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         write!(f, "Counting({})", self.inner)
///     }
/// }
///
/// forward! {
///     impl[R: Registry] Registry for Counting<R> {
///         forward to inner: deregister, list, list_shared, snapshot, capabilities, probe;
///         async fn register(&self, endpoint: Endpoint) -> Result<()> {
///             self.registered.fetch_add(1, Ordering::Relaxed);
///             self.inner.register(endpoint).await
///         }
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let counting = Counting { inner: waypost::memory::MemoryRegistry::new(), registered: AtomicU64::new(0) };
/// counting.register(Endpoint::new("api", "a", "10.0.0.1", 80)).await?;
/// assert_eq!(counting.list("api").await?.len(), 1);
/// assert_eq!(counting.registered.load(Ordering::Relaxed), 1);
/// # Ok::<(), waypost::Error>(())
/// # }).unwrap();
/// ```
#[macro_export]
macro_rules! forward {
    (
        impl [$($generics:tt)*] $trait:ident for $ty:ty {
            forward to $to:tt: $($method:ident),* $(,)?;
            $($own:tt)*
        }
    ) => {
        $crate::forward!(@names $trait [$($method)*] $($own)*);
        $crate::forward!(@munch [$($generics)*] $trait [$ty] $to [$($method)*] [$($own)*]);
    };

    // Every method of the trait is forwarded or written: the names of
    // both, matched against the trait's list of methods, must be
    // exhaustive. (Clippy skips lints inside another crate's macros, so
    // `missing_trait_methods` alone would not hold a caller to it.)
    (@names $trait:ident [$($name:ident)*] fn $written:ident $($rest:tt)*) => {
        $crate::forward!(@names $trait [$($name)* $written] $($rest)*);
    };
    (@names $trait:ident [$($name:ident)*] $skip:tt $($rest:tt)*) => {
        $crate::forward!(@names $trait [$($name)*] $($rest)*);
    };
    (@names $trait:ident [$($name:ident)*]) => {
        const _: () = {
            #[allow(dead_code)]
            fn every_method_is_forwarded_or_written(method: $crate::forward::$trait) {
                match method {
                    $($crate::forward::$trait::$name => {})*
                }
            }
        };
    };

    (@munch [$($generics:tt)*] $trait:ident [$ty:ty] $to:tt [] [$($items:tt)*]) => {
        #[deny(clippy::missing_trait_methods)]
        #[$crate::forward::__async_trait]
        impl<$($generics)*> $crate::$trait for $ty {
            $($items)*
        }
    };

    // Registry
    (@munch $g:tt $trait:ident $ty:tt $to:tt [register $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn register(&self, endpoint: $crate::Endpoint) -> $crate::Result<()> {
                $crate::forward!(@to self $to).register(endpoint).await
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [deregister $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn deregister(&self, key: &$crate::EndpointKey) -> $crate::Result<()> {
                $crate::forward!(@to self $to).deregister(key).await
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [list $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn list(&self, service: &str) -> $crate::Result<::std::vec::Vec<$crate::Endpoint>> {
                $crate::forward!(@to self $to).list(service).await
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [list_shared $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn list_shared(
                &self,
                service: &str,
            ) -> $crate::Result<::std::sync::Arc<[$crate::Endpoint]>> {
                $crate::forward!(@to self $to).list_shared(service).await
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [snapshot $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn snapshot(&self) -> $crate::Result<$crate::Snapshot> {
                $crate::forward!(@to self $to).snapshot().await
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [capabilities $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            fn capabilities(&self) -> $crate::Capabilities {
                $crate::forward!(@to self $to).capabilities()
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [probe $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn probe(&self) -> $crate::Result<()> {
                $crate::forward!(@to self $to).probe().await
            }
        ]);
    };

    // Batch
    (@munch $g:tt $trait:ident $ty:tt $to:tt [apply $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn apply(&self, ops: ::std::vec::Vec<$crate::Op>) -> $crate::Result<()> {
                $crate::forward!(@to self $to).apply(ops).await
            }
        ]);
    };
    (@munch $g:tt $trait:ident $ty:tt $to:tt [max_batch $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            fn max_batch(&self) -> usize {
                $crate::forward!(@to self $to).max_batch()
            }
        ]);
    };

    // Heartbeat
    (@munch $g:tt $trait:ident $ty:tt $to:tt [heartbeat $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            async fn heartbeat(&self, node: &str) -> $crate::Result<()> {
                $crate::forward!(@to self $to).heartbeat(node).await
            }
        ]);
    };

    // Watch
    (@munch $g:tt $trait:ident $ty:tt $to:tt [watch $($rest:ident)*] [$($items:tt)*]) => {
        $crate::forward!(@munch $g $trait $ty $to [$($rest)*] [$($items)*
            fn watch(&self, from: ::std::option::Option<$crate::Version>) -> $crate::EventStream {
                $crate::forward!(@to self $to).watch(from)
            }
        ]);
    };

    (@to $self:tt *) => { (**$self) };
    (@to $self:tt $field:tt) => { $self.$field };
}

#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;

macro_rules! methods {
    ($($trait:ident: $($method:ident),*;)*) => {$(
        #[doc(hidden)]
        #[allow(non_camel_case_types, missing_docs)]
        pub enum $trait {
            $($method),*
        }
    )*};
}

// The methods of each trait, for the check in `forward!`. A method added to
// a trait goes here and into `forward!`'s rules; the forwarding impls for
// `Arc` and `Box` (in `traits.rs`) fail `clippy::missing_trait_methods`
// until it does.
methods! {
    Registry: register, deregister, list, list_shared, snapshot, capabilities, probe;
    Batch: apply, max_batch;
    Heartbeat: heartbeat;
    Watch: watch;
}
