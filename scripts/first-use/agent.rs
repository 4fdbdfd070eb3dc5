//! A user's first agent, built outside the workspace as a user would build
//! it (`scripts/front-door` writes its Cargo.toml with path dependencies on
//! `waypost` and `waypost-registrar-client` only): it registers one endpoint
//! through the registrar at the address given as its first argument,
//! durably (the registrar answers once the backend committed it), and
//! reads it back from its local cache.

use std::time::Duration;

use waypost::prelude::*;
use waypost_registrar_client::{Ack, ClientConfig, RegistrarClient};

#[tokio::main]
async fn main() -> waypost::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:9443".to_string());
    let cfg = ClientConfig::new(address, "default", "node-1").with_ack(Ack::Durable);
    let agent = RegistrarClient::connect(cfg)?;
    agent
        .register(Endpoint::new("web", "web-1", "127.0.0.1", 8080).with_node("node-1"))
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !agent.list("web").await?.iter().any(|e| e.id == "web-1") {
        if tokio::time::Instant::now() > deadline {
            return Err(Error::unavailable("web/web-1 never reached the local cache"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("web/web-1 registered through the registrar and in the local cache");
    Ok(())
}
