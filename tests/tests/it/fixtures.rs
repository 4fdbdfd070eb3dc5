//! The fixtures start real servers and clean up after themselves.

use std::net::TcpStream;

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[test]
fn etcd_starts_restarts_and_stops() {
    let mut etcd = waypost_fixtures::EtcdServer::start().unwrap();
    let addr = addr_of(etcd.endpoint());
    assert!(TcpStream::connect(&addr).is_ok());
    etcd.kill();
    assert!(
        TcpStream::connect(&addr).is_err(),
        "etcd still answers after kill"
    );
    etcd.restart().unwrap();
    assert!(TcpStream::connect(&addr).is_ok());
    drop(etcd);
    assert!(
        TcpStream::connect(&addr).is_err(),
        "etcd still answers after drop"
    );
}

#[test]
fn moto_starts_and_stops() {
    let moto = waypost_fixtures::MotoServer::start().unwrap();
    let addr = addr_of(moto.url());
    assert!(TcpStream::connect(&addr).is_ok());
    drop(moto);
    assert!(
        TcpStream::connect(&addr).is_err(),
        "moto still answers after drop"
    );
}

#[test]
fn a_missing_program_is_named() {
    let err = waypost_fixtures::ServerProcess::spawn(
        "no-such-server-binary",
        "install it",
        |_| vec![],
        "127.0.0.1:1".parse().unwrap(),
        std::time::Duration::from_secs(1),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("no-such-server-binary"), "{err}");
}
