//! What every transaction of the registry is built from: the limit of
//! actions, the `ClientRequestToken`, the actions of endpoint ops, the
//! conditions written beside them ([`Guard`]) and how to tell which
//! condition cancelled a transaction.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem};
use waypost::{EndpointKey, Error, Op, Result};

use crate::client::Client;
use crate::layout;

/// Most actions DynamoDB takes in one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

/// A `ClientRequestToken` unique to this call: 32 hex digits from the time,
/// the process, a counter and the process's random hash seed.
pub(crate) fn new_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let seed = SEED.get_or_init(std::collections::hash_map::RandomState::new);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let part = |salt: u8| seed.hash_one((salt, n, nanos, std::process::id()));
    format!("{:016x}{:016x}", part(1), part(2))
}

/// Conditions written in one transaction with a batch: `items` (whose
/// keys, for messages, are `keys`), and with `existing`, each endpoint
/// write only if its item exists.
#[derive(Default)]
pub(crate) struct Guard {
    pub items: Vec<TransactWriteItem>,
    pub keys: Vec<EndpointKey>,
    pub existing: bool,
}

/// Whether a cancelled transaction failed a condition of an action in
/// `range` (the batch's own endpoint actions, or its guard).
pub(crate) fn failed_within(
    err: &SdkError<TransactWriteItemsError>,
    range: std::ops::Range<usize>,
) -> bool {
    match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(e)) => e
            .cancellation_reasons()
            .iter()
            .enumerate()
            .any(|(i, r)| range.contains(&i) && r.code() == Some("ConditionalCheckFailed")),
        _ => false,
    }
}

/// A transaction action that could not be built, as an error.
pub(crate) fn build_err(e: aws_sdk_dynamodb::error::BuildError) -> Error {
    Error::internal(format!("building a transaction item: {e}")).with_source(e)
}

/// The transaction actions of `ops` (one per key) on `client`'s table: a
/// put of the endpoint's item, or a delete of the key; with `existing`,
/// each put only if the item exists.
pub(crate) fn op_items(
    client: &Client,
    ops: &[Op],
    existing: bool,
) -> Result<Vec<TransactWriteItem>> {
    let ttl = client.ttl_write();
    ops.iter()
        .map(|op| {
            let b = TransactWriteItem::builder();
            match op {
                Op::Register(e) => {
                    let put = Put::builder()
                        .table_name(client.table())
                        .set_item(Some(layout::encode(e, ttl)));
                    let put = if existing {
                        put.condition_expression("attribute_exists(#id)")
                            .expression_attribute_names("#id", layout::ID)
                    } else {
                        put
                    };
                    put.build().map(|p| b.put(p).build())
                }
                Op::Deregister(k) => Delete::builder()
                    .table_name(client.table())
                    .set_key(Some(layout::key_item(k)))
                    .build()
                    .map(|d| b.delete(d).build()),
            }
            .map_err(build_err)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_short() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert!(a.len() <= 36);
    }
}
