//! Cutting a watch response's body into its events: in protobuf each event is a 4-byte big-endian
//! length and that many bytes (the API server's `LengthDelimitedFramer`); in JSON each is one line.

use bytes::{Buf, Bytes, BytesMut};

use super::DecodeError;

/// The largest event accepted: far above the largest object the API server stores (etcd's request
/// limit is 1.5 MiB), so that a corrupt length fails the watch instead of growing the buffer without
/// end.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// How a watch body's events are delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// A 4-byte big-endian length before each event.
    LengthPrefixed,
    /// A newline after each event.
    Lines,
}

/// The body read so far, cut into events as they complete.
#[derive(Debug)]
pub(crate) struct Frames {
    framing: Framing,
    buffer: BytesMut,
}

impl Frames {
    pub(crate) fn new(framing: Framing) -> Self {
        Self {
            framing,
            buffer: BytesMut::new(),
        }
    }

    /// Adds the body's next chunk.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete event, if the body holds one yet.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Bytes>, DecodeError> {
        match self.framing {
            Framing::LengthPrefixed => {
                let Some(header) = self.buffer.get(..4) else {
                    return Ok(None);
                };
                let length = u32::from_be_bytes(header.try_into().expect("four bytes")) as usize;
                if length > MAX_FRAME {
                    return Err(DecodeError::FrameTooLarge { length });
                }
                if self.buffer.len() < 4 + length {
                    return Ok(None);
                }
                self.buffer.advance(4);
                Ok(Some(self.buffer.split_to(length).freeze()))
            }
            Framing::Lines => loop {
                let Some(end) = self.buffer.iter().position(|&b| b == b'\n') else {
                    if self.buffer.len() > MAX_FRAME {
                        return Err(DecodeError::FrameTooLarge {
                            length: self.buffer.len(),
                        });
                    }
                    return Ok(None);
                };
                let line = self.buffer.split_to(end + 1).freeze().slice(..end);
                if !line.iter().all(u8::is_ascii_whitespace) {
                    return Ok(Some(line));
                }
            },
        }
    }

    /// What is left of an event when the body ended (nothing, when it ended between events).
    pub(crate) fn rest(&self) -> usize {
        self.buffer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixed(events: &[&[u8]]) -> Vec<u8> {
        let mut body = Vec::new();
        for event in events {
            body.extend_from_slice(&u32::try_from(event.len()).unwrap().to_be_bytes());
            body.extend_from_slice(event);
        }
        body
    }

    /// A framing, a body, and the events it holds.
    type Case = (Framing, Vec<u8>, &'static [&'static [u8]]);

    /// Every event comes out whole, whatever the chunks the body arrives in.
    #[test]
    fn events_come_out_whole_from_any_chunking() {
        let cases: &[Case] = &[
            (
                Framing::LengthPrefixed,
                prefixed(&[b"first", b"", b"third event"]),
                &[b"first", b"", b"third event"],
            ),
            (
                Framing::Lines,
                b"{\"a\":1}\n\n{\"b\":2}\n".to_vec(),
                &[b"{\"a\":1}", b"{\"b\":2}"],
            ),
        ];
        for (framing, body, expected) in cases {
            for chunk in [1, 3, 7, body.len()] {
                let mut frames = Frames::new(*framing);
                let mut out = Vec::new();
                for piece in body.chunks(chunk) {
                    frames.push(piece);
                    while let Some(frame) = frames.next_frame().unwrap() {
                        out.push(frame);
                    }
                }
                let out: Vec<&[u8]> = out.iter().map(|b| b.as_ref()).collect();
                assert_eq!(&out, expected, "{framing:?} in chunks of {chunk}");
                assert_eq!(frames.rest(), 0);
            }
        }
    }

    #[test]
    fn a_partial_event_waits_and_a_huge_length_fails() {
        let mut frames = Frames::new(Framing::LengthPrefixed);
        frames.push(&[0, 0, 0, 9, b'a']);
        assert_eq!(frames.next_frame().unwrap(), None);
        assert_eq!(frames.rest(), 5);

        let mut frames = Frames::new(Framing::LengthPrefixed);
        frames.push(&u32::MAX.to_be_bytes());
        let err = frames.next_frame().unwrap_err();
        assert_eq!(
            err.to_string(),
            "a watch event of 4294967295 bytes is larger than the 67108864 bytes accepted"
        );
    }
}
