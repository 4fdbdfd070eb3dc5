//! The codec of the ADS streams: a response goes out as the encodings of
//! its resources, made once for every stream that sends them
//! ([`super::resources::Resource`]), followed by the fields of the
//! stream's own (its nonce, version and type, removed names), encoded
//! there. A protobuf message may carry its fields in any order, and the
//! elements of a repeated field keep theirs, so the client decodes exactly
//! the `DiscoveryResponse` or `DeltaDiscoveryResponse` it would from one
//! message encoded whole.

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// One response on its way to a client.
#[derive(Debug, Clone, Default)]
pub(crate) struct Frame<M> {
    /// Elements of the response's repeated `resources` field, each encoded
    /// with its key (shared by every stream that sends the resource).
    pub(crate) resources: Vec<Bytes>,
    /// The rest of the response, with `resources` empty.
    pub(crate) own: M,
}

impl<M: Message + Default> Frame<M> {
    /// The whole response, decoded (for tests and logs).
    #[cfg(test)]
    pub(crate) fn message(&self) -> M {
        let mut buf = Vec::new();
        for r in &self.resources {
            buf.extend_from_slice(r);
        }
        self.own.encode(&mut buf).expect("a Vec grows");
        M::decode(buf.as_slice()).expect("a frame decodes")
    }
}

/// The ADS codec: decodes requests `Q`, encodes [`Frame`]s of `M`.
#[derive(Debug)]
pub(crate) struct FrameCodec<Q, M>(PhantomData<fn(Q) -> M>);

impl<Q, M> Default for FrameCodec<Q, M> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<Q, M> Codec for FrameCodec<Q, M>
where
    Q: Message + Default + Send + 'static,
    M: Message + Send + 'static,
{
    type Encode = Frame<M>;
    type Decode = Q;
    type Encoder = FrameEncoder<M>;
    type Decoder = RequestDecoder<Q>;

    fn encoder(&mut self) -> FrameEncoder<M> {
        FrameEncoder(PhantomData)
    }

    fn decoder(&mut self) -> RequestDecoder<Q> {
        RequestDecoder(PhantomData)
    }
}

/// Writes a [`Frame`] into tonic's buffer (tonic adds the length prefix).
#[derive(Debug)]
pub(crate) struct FrameEncoder<M>(PhantomData<fn(M)>);

impl<M: Message> Encoder for FrameEncoder<M> {
    type Item = Frame<M>;
    type Error = Status;

    fn encode(&mut self, item: Frame<M>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let shared: usize = item.resources.iter().map(Bytes::len).sum();
        dst.reserve(shared + item.own.encoded_len());
        for r in &item.resources {
            dst.put_slice(r);
        }
        item.own
            .encode(dst)
            .map_err(|e| Status::internal(format!("encoding an xDS response: {e}")))
    }
}

/// Decodes a request (errors as tonic's prost codec reports them:
/// `INTERNAL`).
#[derive(Debug)]
pub(crate) struct RequestDecoder<Q>(PhantomData<fn() -> Q>);

impl<Q: Message + Default> Decoder for RequestDecoder<Q> {
    type Item = Q;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Q>, Status> {
        Q::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}
