//! The codec of `WatchEndpoints` responses: a message that was encoded once
//! for every stream goes out as its bytes, copied into the stream's write
//! buffer; a message of the stream's own is encoded there, as tonic's
//! prost codec does. Either way the client receives exactly the
//! `EndpointEvent` the proto documents.

use bytes::Bytes;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;
use waypost_registrar_client::proto::registrar::v1::EndpointEvent;

use super::request::WatchRequest;

/// One `EndpointEvent` on its way to a client.
#[derive(Debug, Clone)]
pub(crate) enum Frame {
    /// Its protobuf encoding (the message without gRPC's length prefix),
    /// shared by every stream that sends it.
    Shared(Bytes),
    /// The message itself, encoded for this stream alone.
    Own(Box<EndpointEvent>),
}

impl Frame {
    /// The message of a frame; a shared one is decoded (only the
    /// per-stream path of the generated service asks for this).
    pub(crate) fn into_message(self) -> Result<EndpointEvent, Status> {
        match self {
            Frame::Own(m) => Ok(*m),
            Frame::Shared(b) => EndpointEvent::decode(b)
                .map_err(|e| Status::internal(format!("a shared event does not decode: {e}"))),
        }
    }
}

/// `WatchEndpoints`' codec: decodes the request, encodes [`Frame`]s.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FrameCodec;

impl Codec for FrameCodec {
    type Encode = Frame;
    type Decode = WatchRequest;
    type Encoder = FrameEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

/// Writes a [`Frame`] into tonic's buffer (tonic adds the length prefix,
/// and batches what the stream yields while the transport is busy, up to
/// [`YIELD_THRESHOLD`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FrameEncoder;

/// How many bytes tonic gathers from a stream's ready messages before it
/// hands them to hyper as one body chunk (tonic's default is 32 KiB). A
/// chunk is the unit hyper holds back, and HTTP/2 queues, for a stream
/// whose client's window is full: a stream that stops reading holds about
/// two, each at most this plus one message. Below the default snapshot
/// message ([`crate::engine::config::DEFAULT_SNAPSHOT_CHUNK_BYTES`]), so each such message
/// goes out as a chunk of its own, and a lagging stream's deltas (a few
/// hundred bytes each) still go out dozens at a time.
pub(crate) const YIELD_THRESHOLD: usize = 8 * 1024;

/// The buffer tonic allocates for a stream's messages (its default).
const BUFFER_SIZE: usize = 8 * 1024;

impl Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
    }

    fn encode(&mut self, item: Frame, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            Frame::Shared(bytes) => {
                dst.reserve(bytes.len());
                bytes::BufMut::put_slice(dst, &bytes);
                Ok(())
            }
            Frame::Own(msg) => msg
                .encode(dst)
                .map_err(|e| Status::internal(format!("encoding an event: {e}"))),
        }
    }
}

/// Decodes the `WatchEndpointsRequest`, the agent's summary left as its
/// bytes ([`WatchRequest`]; errors as tonic's prost codec reports them:
/// `INTERNAL`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = WatchRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        WatchRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// `message` encoded once, to be shared.
pub(crate) fn encode(message: &EndpointEvent) -> Bytes {
    Bytes::from(message.encode_to_vec())
}
