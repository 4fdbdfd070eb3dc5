//! The field primitives every encoder and decoder is built from.
//!
//! Every decoder reads through [`Reader`], which checks each length against
//! what is left of the packet, so a truncated or forged packet is an
//! error, never a panic or an over-read. Every encoder writes through
//! [`Writer`], which refuses a length that does not fit its prefix.
//! Integers are big-endian; strings are UTF-8 behind a one- or two-byte
//! length; lists are behind a two-byte count.

/// Why a packet could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A length ran past the end of the packet.
    #[error("truncated: needed {needed} bytes, {left} left")]
    Truncated {
        /// Bytes the field needed.
        needed: usize,
        /// Bytes left in the packet.
        left: usize,
    },
    /// A field held a value that cannot be.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// The decoded endpoint does not pass validation.
    #[error("invalid endpoint: {0}")]
    Endpoint(String),
    /// Bytes were left over after the last field.
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// Why something could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A value is longer than its length prefix allows.
    #[error("{0} too long for the wire format")]
    TooLong(&'static str),
    /// The destination buffer is full.
    #[error("buffer full")]
    Full,
}

/// A bounds-checked cursor over a packet.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// The unread bytes.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Fail unless everything was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated {
                needed: n,
                left: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    /// Big-endian u16.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    /// Big-endian u32.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    /// Big-endian u64.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn string(&mut self, len: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(len)?.to_vec()).map_err(|_| DecodeError::Invalid("utf-8"))
    }
    /// A string with a one-byte length.
    pub fn str8(&mut self) -> Result<String, DecodeError> {
        let n = self.u8()?;
        self.string(usize::from(n))
    }
    /// A string with a two-byte length.
    pub fn str16(&mut self) -> Result<String, DecodeError> {
        let n = self.u16()?;
        self.string(usize::from(n))
    }
}

/// Append helpers; lengths that do not fit their prefix are errors.
pub struct Writer {
    /// The bytes written so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self { buf: Vec::new() }
    }
    /// One byte.
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// Big-endian u16.
    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Big-endian u32.
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Big-endian u64.
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// A string with a one-byte length.
    pub(crate) fn str8(&mut self, s: &str) -> Result<(), EncodeError> {
        let n = u8::try_from(s.len()).map_err(|_| EncodeError::TooLong("short string"))?;
        self.u8(n);
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
    /// A string with a two-byte length.
    pub(crate) fn str16(&mut self, s: &str) -> Result<(), EncodeError> {
        let n = u16::try_from(s.len()).map_err(|_| EncodeError::TooLong("string"))?;
        self.u16(n);
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
    /// The two-byte count in front of a list of `n` items.
    pub(crate) fn count(&mut self, n: usize) -> Result<(), EncodeError> {
        self.u16(u16::try_from(n).map_err(|_| EncodeError::TooLong("list"))?);
        Ok(())
    }
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}
