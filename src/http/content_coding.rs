//! Compressed request bodies (`Content-Encoding`: `gzip`, `deflate`, `br`, `zstd`, and
//! several of them in the order applied): decoded so that a compacted route can read the
//! conversation, within a limit on the decoded size, so that a small body that inflates
//! past `server.max_body_size` (a decompression bomb) costs no more memory than the limit.
//!
//! Decoding is synchronous over bytes already in memory: the whole encoded body has been
//! read within the same limit first.

use std::io::Read;

use http::HeaderMap;
use http::header::CONTENT_ENCODING;

pub use crate::vocab::ContentCoding as Coding;

/// The coding a `Content-Encoding` token names; `None` for an unknown one.
fn coding_of(token: &str) -> Option<Coding> {
    match token.to_ascii_lowercase().as_str() {
        "gzip" | "x-gzip" => Some(Coding::Gzip),
        "deflate" => Some(Coding::Deflate),
        "br" => Some(Coding::Brotli),
        "zstd" => Some(Coding::Zstd),
        _ => None,
    }
}

/// What a request's `Content-Encoding` asks of its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoding {
    /// No coding (absent, empty, or `identity`): the body is its content.
    Identity,
    /// Codings in the order they were applied (decoded last to first).
    Coded(Vec<Coding>),
    /// A coding foldgate does not know; the token as sent, for the log.
    Unknown(String),
}

/// The encoding `headers` declare for the body (every `Content-Encoding` line, in order).
pub fn encoding(headers: &HeaderMap) -> Encoding {
    let mut codings = Vec::new();
    for value in headers.get_all(CONTENT_ENCODING) {
        let Ok(value) = value.to_str() else {
            return Encoding::Unknown(String::from_utf8_lossy(value.as_bytes()).into_owned());
        };
        for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if token.eq_ignore_ascii_case("identity") {
                continue;
            }
            match coding_of(token) {
                Some(coding) => codings.push(coding),
                None => return Encoding::Unknown(token.to_owned()),
            }
        }
    }
    if codings.is_empty() { Encoding::Identity } else { Encoding::Coded(codings) }
}

/// Why a body could not be decoded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The decoded body would exceed the limit.
    #[error("the decoded body exceeds {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The bytes are not valid for their coding.
    #[error("the body is not valid {coding}: {message}")]
    Invalid {
        /// The coding's name.
        coding: &'static str,
        /// What the decoder said.
        message: String,
    },
}

/// `body` decoded through `codings` (in the order they were applied), each step's output
/// at most `limit` bytes.
pub fn decode(body: &[u8], codings: &[Coding], limit: u64) -> Result<Vec<u8>, DecodeError> {
    let mut current: Option<Vec<u8>> = None;
    for &coding in codings.iter().rev() {
        let input = current.as_deref().unwrap_or(body);
        current = Some(decode_one(input, coding, limit)?);
    }
    Ok(current.unwrap_or_else(|| body.to_vec()))
}

/// One coding undone, output bounded by `limit`.
fn decode_one(input: &[u8], coding: Coding, limit: u64) -> Result<Vec<u8>, DecodeError> {
    let result = match coding {
        Coding::Gzip => bounded(flate2::read::MultiGzDecoder::new(input), limit),
        Coding::Deflate => match bounded(flate2::read::ZlibDecoder::new(input), limit) {
            Err(Bounded::Io(_)) => bounded(flate2::read::DeflateDecoder::new(input), limit),
            other => other,
        },
        Coding::Brotli => bounded(brotli_decompressor::Decompressor::new(input, 64 * 1024), limit),
        Coding::Zstd => return zstd_frames(input, limit),
    };
    result.map_err(|stop| stop.into_error(coding, limit))
}

/// Every Zstandard frame of `input` in turn (skippable frames skipped), the whole output
/// bounded by `limit`. A frame may not ask for a window (the memory its decoder
/// reserves at once) larger than `limit` or 8 MiB, whichever is more.
fn zstd_frames(mut input: &[u8], limit: u64) -> Result<Vec<u8>, DecodeError> {
    use ruzstd::decoding::StreamingDecoder;
    use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
    let invalid = |message: String| DecodeError::Invalid { coding: "zstd", message };
    let max_window = limit.max(8 << 20);
    let mut out = Vec::new();
    while !input.is_empty() {
        let room = limit.saturating_sub(out.len() as u64);
        let decoder = match StreamingDecoder::new_with_max_window_size(&mut input, max_window) {
            Ok(decoder) => decoder,
            Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                length,
                ..
            })) => {
                input = input
                    .get(length as usize..)
                    .ok_or_else(|| invalid("a skippable frame runs past the end".to_owned()))?;
                continue;
            }
            Err(e) => return Err(invalid(e.to_string())),
        };
        let frame = bounded(decoder, room).map_err(|s| s.into_error(Coding::Zstd, limit))?;
        if out.is_empty() {
            out = frame;
        } else {
            out.extend_from_slice(&frame);
        }
    }
    Ok(out)
}

/// Why a bounded read stopped short.
enum Bounded {
    /// More than the limit would come out.
    TooLarge,
    /// The decoder failed.
    Io(std::io::Error),
}

impl Bounded {
    /// The error of a decoder of `coding` that stopped so under `limit`.
    fn into_error(self, coding: Coding, limit: u64) -> DecodeError {
        match self {
            Self::TooLarge => DecodeError::TooLarge { limit },
            Self::Io(e) => DecodeError::Invalid { coding: coding.as_str(), message: e.to_string() },
        }
    }
}

/// Reads `reader` to its end, failing once more than `limit` bytes would come out (at
/// most one read of 64 KiB past the limit tells, and is never kept).
fn bounded(mut reader: impl Read, limit: u64) -> Result<Vec<u8>, Bounded> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Bounded::Io(e)),
        };
        if n > limit - out.len() {
            return Err(Bounded::TooLarge);
        }
        // Grown by doubling as `Vec` does, but never past the limit: a bomb stopped at
        // the limit holds the limit, not twice it.
        if out.capacity() - out.len() < n {
            let wanted = (out.capacity() * 2).max(out.len() + n).min(limit);
            out.reserve_exact(wanted - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const TEXT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

    fn headers(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.append(CONTENT_ENCODING, http::HeaderValue::from_static(value));
        headers
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn brotli(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        e.write_all(data).unwrap();
        drop(e);
        out
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    #[test]
    fn the_header_names_the_codings_in_the_order_applied() {
        assert_eq!(encoding(&HeaderMap::new()), Encoding::Identity);
        assert_eq!(encoding(&headers("identity")), Encoding::Identity);
        assert_eq!(encoding(&headers("GZIP")), Encoding::Coded(vec![Coding::Gzip]));
        assert_eq!(
            encoding(&headers("deflate, br")),
            Encoding::Coded(vec![Coding::Deflate, Coding::Brotli])
        );
        let mut two = headers("zstd");
        two.append(CONTENT_ENCODING, http::HeaderValue::from_static("x-gzip"));
        assert_eq!(encoding(&two), Encoding::Coded(vec![Coding::Zstd, Coding::Gzip]));
        assert_eq!(encoding(&headers("gzip, compress")), Encoding::Unknown("compress".into()));
    }

    #[test]
    fn every_coding_decodes() {
        for (coding, body) in [
            (Coding::Gzip, gzip(TEXT)),
            (Coding::Deflate, zlib(TEXT)),
            (Coding::Deflate, raw_deflate(TEXT)),
            (Coding::Brotli, brotli(TEXT)),
            (Coding::Zstd, zstd(TEXT)),
        ] {
            assert_eq!(decode(&body, &[coding], 1 << 20).unwrap(), TEXT, "{coding:?}");
        }
        // Several codings are undone last to first; several members or frames follow on.
        let stacked = brotli(&gzip(TEXT));
        assert_eq!(decode(&stacked, &[Coding::Gzip, Coding::Brotli], 1 << 20).unwrap(), TEXT);
        let members = [gzip(b"ab"), gzip(b"cd")].concat();
        assert_eq!(decode(&members, &[Coding::Gzip], 10).unwrap(), b"abcd");
        let mut skippable = vec![0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3];
        let frames = [zstd(b"ab"), skippable.clone(), zstd(b"cd")].concat();
        assert_eq!(decode(&frames, &[Coding::Zstd], 10).unwrap(), b"abcd");
        skippable.truncate(9);
        assert!(decode(&skippable, &[Coding::Zstd], 10).is_err());
    }

    #[test]
    fn output_past_the_limit_is_refused_before_it_is_held() {
        let big = vec![b'a'; 4 << 20];
        for (coding, body) in [
            (Coding::Gzip, gzip(&big)),
            (Coding::Deflate, zlib(&big)),
            (Coding::Brotli, brotli(&big)),
            (Coding::Zstd, zstd(&big)),
        ] {
            assert!(body.len() < 64 << 10, "{coding:?} compresses {} bytes", body.len());
            assert_eq!(
                decode(&body, &[coding], 1 << 20),
                Err(DecodeError::TooLarge { limit: 1 << 20 }),
                "{coding:?}"
            );
            assert_eq!(decode(&body, &[coding], 4 << 20).unwrap().len(), 4 << 20);
        }
    }

    #[test]
    fn invalid_bytes_are_an_error_not_a_panic() {
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd] {
            for body in [&b""[..], b"not compressed at all", &[0xff; 64], &gzip(TEXT)[..12]] {
                let _ = decode(body, &[coding], 1 << 20);
            }
            assert!(matches!(
                decode(b"not compressed", &[coding], 1 << 20),
                Err(DecodeError::Invalid { .. })
            ));
        }
    }
}
