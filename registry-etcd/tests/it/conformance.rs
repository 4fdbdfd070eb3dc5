//! The waypost conformance suite against a real etcd (the
//! `waypost_fixtures` fixture), the only place it runs for this backend:
//! each check gets an etcd of its own, because `lose_history` compacts the
//! whole server.

use waypost::testing::Guarded;
use waypost_etcd::EtcdRegistry;
use waypost_fixtures::EtcdServer;

async fn make() -> Guarded<EtcdRegistry> {
    waypost_fixtures::registries::etcd()
        .await
        .expect("a registry on a fixture etcd (apt-get install etcd-server)")
}

/// Compact etcd past every change made so far.
async fn lose_history(reg: &Guarded<EtcdRegistry>) {
    let etcd = reg.guard::<EtcdServer>().expect("the etcd fixture");
    waypost_fixtures::registries::compact_etcd(etcd.endpoint())
        .await
        .expect("compact");
}

waypost::conformance_tests!(make, lose_history);
