//! DNS over TCP: length-prefixed messages (RFC 1035 4.2.2), one task per
//! connection, answered whole (up to a message's 64 KiB).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::answer::{respond, Transport};
use super::index::Indexer;

/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Accept connections on `listener` and answer them from `indexer`.
pub(super) async fn serve(listener: TcpListener, indexer: Arc<Indexer>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_conn(stream, Arc::clone(&indexer)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "DNS: accepting a TCP connection failed");
                // Out of file descriptors and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answer the queries of one connection until the peer closes it or
/// stays idle for [`TCP_IDLE`].
async fn serve_conn(mut stream: TcpStream, indexer: Arc<Indexer>) {
    let (mut msg, mut key, mut out, mut frame) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(TCP_IDLE, stream.read_u16()).await else {
            return;
        };
        msg.resize(usize::from(len), 0);
        if !matches!(
            tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut msg)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let answered = {
            let view = indexer.view();
            let index = view.as_deref().map(|i| &**i);
            respond(
                indexer.zone(),
                index,
                &msg,
                Transport::Tcp,
                &mut key,
                &mut out,
            )
        };
        if !answered {
            return;
        }
        // At most 65,535 bytes: longer answers come truncated.
        let Ok(out_len) = u16::try_from(out.len()) else {
            return;
        };
        frame.clear();
        frame.extend_from_slice(&out_len.to_be_bytes());
        frame.extend_from_slice(&out);
        if stream.write_all(&frame).await.is_err() {
            return;
        }
    }
}
