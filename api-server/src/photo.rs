//! Worker photos: the upload is decoded (so only real images get in),
//! bounded in size and dimensions, turned upright, and re-encoded, which
//! drops every byte of metadata (EXIF location, camera serials, comments).
//!
//! Decoding is where a small file costs a lot: a zero-filled 8192 × 8192
//! PNG of a few hundred kilobytes decodes to 256 MiB (RGBA16: 512 MiB).
//! So the header is read first ([`inspect`]): its dimensions are checked
//! per side and in all, and the memory the decode and re-encode will need
//! is computed from it and reserved from a budget every decode of the
//! process shares ([`DecodeMemory`]) before a pixel is decoded. The
//! re-encoded photo is never stored larger than the upload limit.

use std::io::Cursor;
use std::sync::Arc;

use axum::body::Bytes;

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

/// Media types accepted on upload.
pub const ACCEPTED_TYPES: [&str; 3] = ["image/jpeg", "image/png", "image/webp"];

/// The bytes of an image, as the OpenAPI document describes photo bodies: a
/// binary string, so that generated clients send and receive raw bytes
/// (a `Vec<u8>` would be documented as an array of integers).
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // describes the document; bodies are read as `Bytes`
pub struct ImageBytes(Vec<u8>);

/// Default bound on width × height: 40 megapixels, above any phone's
/// default photo.
pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;
/// Default memory all photo decodes of the process may hold at once. The
/// chart gives the API pod 256 MiB; the server itself needs about 25.
pub const DEFAULT_DECODE_MEMORY_BYTES: u64 = 128 * 1024 * 1024;
/// Default cap on the photo bytes stored for one task.
pub const DEFAULT_MAX_TASK_BYTES: u64 = 100 * 1024 * 1024;

/// Bounds on an upload.
#[derive(Debug, Clone)]
pub struct PhotoLimits {
    /// Largest upload in bytes, and largest photo stored after re-encoding.
    pub max_bytes: usize,
    /// Largest width or height in pixels.
    pub max_dimension: u32,
    /// Largest width × height.
    pub max_pixels: u64,
    /// Most photo bytes stored for one task; beyond it uploads are refused.
    pub max_task_bytes: u64,
    /// Memory shared by every decode in flight (see [`DecodeMemory`]).
    pub decode_memory: DecodeMemory,
}

impl PhotoLimits {
    /// The given upload and dimension bounds with the default pixel,
    /// per-task and decode-memory bounds.
    pub fn new(max_bytes: usize, max_dimension: u32) -> Self {
        PhotoLimits {
            max_bytes,
            max_dimension,
            max_pixels: DEFAULT_MAX_PIXELS,
            max_task_bytes: DEFAULT_MAX_TASK_BYTES,
            decode_memory: DecodeMemory::new(DEFAULT_DECODE_MEMORY_BYTES),
        }
    }
}

/// The memory budget of photo decoding, in whole MiB, shared by every
/// upload of the process: a decode reserves what it may need, as computed
/// from the image header before any pixel is decoded, and waits while
/// other decodes hold the budget. A photo that would need more than the
/// whole budget is refused. So however many uploads arrive at once, their
/// pixels never take more than the budget.
#[derive(Debug, Clone)]
pub struct DecodeMemory {
    mib: u32,
    permits: Arc<tokio::sync::Semaphore>,
}

const MIB: u64 = 1024 * 1024;

impl DecodeMemory {
    pub fn new(bytes: u64) -> Self {
        let mib = u32::try_from(bytes / MIB).unwrap_or(u32::MAX).max(1);
        DecodeMemory {
            mib,
            permits: Arc::new(tokio::sync::Semaphore::new(mib as usize)),
        }
    }

    /// The whole budget in bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.mib) * MIB
    }

    /// Reserves `bytes` of the budget until the permit is dropped.
    async fn reserve(&self, bytes: u64) -> Result<tokio::sync::OwnedSemaphorePermit, PhotoError> {
        let mib = bytes.div_ceil(MIB);
        if mib > u64::from(self.mib) {
            return Err(PhotoError::TooLargeToDecode(self.bytes()));
        }
        Arc::clone(&self.permits)
            .acquire_many_owned(mib as u32)
            .await
            .map_err(|_| PhotoError::TooLargeToDecode(self.bytes()))
    }
}

/// A decoded and re-encoded photo.
#[derive(Debug)]
pub struct CleanPhoto {
    pub content_type: &'static str,
    pub width: u32,
    pub height: u32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum PhotoError {
    #[error("the body is not a JPEG, PNG or WebP image")]
    UnsupportedFormat,
    #[error("the image could not be decoded: {0}")]
    Undecodable(String),
    #[error("the image is larger than {0} pixels in width or height")]
    TooManyPixels(u32),
    #[error("the image has more than {0} pixels in all (width × height)")]
    TooManyPixelsInAll(u64),
    #[error("the image needs more than the {} MiB that photo decoding may use", .0 / MIB)]
    TooLargeToDecode(u64),
    #[error("the re-encoded image is larger than {0} bytes")]
    StoredTooLarge(usize),
    #[error("the image could not be re-encoded: {0}")]
    Encode(String),
}

/// What the header of an upload says, read before any pixel is decoded.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    format: ImageFormat,
    /// Bytes the decode and re-encode may hold at most.
    pub memory: u64,
}

/// Reads the header of `bytes` and checks its dimensions: no pixel is
/// decoded, so an image too large costs nothing.
pub fn inspect(bytes: &[u8], limits: &PhotoLimits) -> Result<Header, PhotoError> {
    let (format, decoder) = open(bytes, limits, None)?;
    let (width, height) = decoder.dimensions();
    if width > limits.max_dimension || height > limits.max_dimension {
        return Err(PhotoError::TooManyPixels(limits.max_dimension));
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(PhotoError::TooManyPixelsInAll(limits.max_pixels));
    }
    let mut decoder = decoder;
    let orientation = decoder.orientation().map_err(decode_error(limits))?;
    let decoded = decoder.total_bytes();
    let rotated = matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    );
    let (channels, eight_bit) = output_pixel(format);
    let converted = if decoder.color_type() == eight_bit {
        0
    } else {
        pixels * channels
    };
    // The decoded pixels, a rotated copy, an 8-bit copy for the encoder,
    // the encoded output (capped at the upload limit) and the decoder's
    // own buffers (a row or a block; a slack of 1 MiB).
    let memory =
        decoded + if rotated { decoded } else { 0 } + converted + limits.max_bytes as u64 + MIB;
    Ok(Header { format, memory })
}

/// The pixel layout each format is re-encoded in: channels, and the
/// color type that needs no conversion.
fn output_pixel(format: ImageFormat) -> (u64, image::ColorType) {
    match format {
        ImageFormat::Jpeg => (3, image::ColorType::Rgb8),
        ImageFormat::WebP => (4, image::ColorType::Rgba8),
        // PNG keeps its layout; a 16-bit image becomes 8-bit RGBA.
        _ => (4, image::ColorType::Rgba8),
    }
}

fn open<'a>(
    bytes: &'a [u8],
    limits: &PhotoLimits,
    max_alloc: Option<u64>,
) -> Result<(ImageFormat, Box<dyn image::ImageDecoder + 'a>), PhotoError> {
    let format = image::guess_format(bytes).map_err(|_| PhotoError::UnsupportedFormat)?;
    if !matches!(
        format,
        ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP
    ) {
        return Err(PhotoError::UnsupportedFormat);
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut image_limits = Limits::default();
    image_limits.max_image_width = Some(limits.max_dimension);
    image_limits.max_image_height = Some(limits.max_dimension);
    image_limits.max_alloc = max_alloc.or(Some(limits.decode_memory.bytes()));
    reader.limits(image_limits);
    let decoder = reader.into_decoder().map_err(decode_error(limits))?;
    Ok((format, Box::new(decoder)))
}

/// Checks the header, waits for its share of the decode memory, then
/// decodes and re-encodes the photo on a blocking thread.
pub async fn clean(bytes: Bytes, limits: &PhotoLimits) -> Result<CleanPhoto, PhotoError> {
    let header = inspect(&bytes, limits)?;
    let permit = limits.decode_memory.reserve(header.memory).await?;
    let limits = limits.clone();
    tokio::task::spawn_blocking(move || {
        let cleaned = clean_now(&bytes, &limits, header);
        drop(permit);
        cleaned
    })
    .await
    .map_err(|e| PhotoError::Encode(e.to_string()))?
}

/// Decodes `bytes`, turns the image upright and re-encodes it in the same
/// format, within the memory `header` reserved.
fn clean_now(bytes: &[u8], limits: &PhotoLimits, header: Header) -> Result<CleanPhoto, PhotoError> {
    let (format, mut decoder) = open(bytes, limits, Some(header.memory))?;
    debug_assert_eq!(format, header.format);
    let orientation = decoder.orientation().map_err(decode_error(limits))?;
    let mut img = DynamicImage::from_decoder(decoder).map_err(decode_error(limits))?;
    img.apply_orientation(orientation);
    let (width, height) = (img.width(), img.height());
    let content_type = match format {
        ImageFormat::Jpeg => "image/jpeg",
        ImageFormat::Png => "image/png",
        _ => "image/webp",
    };

    let mut out = Capped {
        bytes: Vec::new(),
        max: limits.max_bytes,
        overflowed: false,
    };
    let encoded = match format {
        ImageFormat::Jpeg => {
            let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
            DynamicImage::ImageRgb8(img.into_rgb8()).write_with_encoder(encoder)
        }
        ImageFormat::Png => {
            let img = match img {
                DynamicImage::ImageLuma8(_)
                | DynamicImage::ImageLumaA8(_)
                | DynamicImage::ImageRgb8(_)
                | DynamicImage::ImageRgba8(_) => img,
                other => DynamicImage::ImageRgba8(other.into_rgba8()),
            };
            img.write_with_encoder(image::codecs::png::PngEncoder::new(&mut out))
        }
        _ => {
            let encoder = image::codecs::webp::WebPEncoder::new_lossless(&mut out);
            DynamicImage::ImageRgba8(img.into_rgba8()).write_with_encoder(encoder)
        }
    };
    if out.overflowed {
        return Err(PhotoError::StoredTooLarge(limits.max_bytes));
    }
    encoded.map_err(|e| PhotoError::Encode(e.to_string()))?;
    Ok(CleanPhoto {
        content_type,
        width,
        height,
        bytes: out.bytes,
    })
}

/// The encoder's output, refusing to grow past `max` bytes.
struct Capped {
    bytes: Vec<u8>,
    max: usize,
    /// A write was refused: the image does not fit.
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            self.overflowed = true;
            return Err(std::io::Error::other("the re-encoded image is too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn decode_error(limits: &PhotoLimits) -> impl Fn(image::ImageError) -> PhotoError {
    let (max_dimension, budget) = (limits.max_dimension, limits.decode_memory.bytes());
    move |e| match e {
        image::ImageError::Limits(l)
            if matches!(l.kind(), image::error::LimitErrorKind::InsufficientMemory) =>
        {
            PhotoError::TooLargeToDecode(budget)
        }
        image::ImageError::Limits(_) => PhotoError::TooManyPixels(max_dimension),
        other => PhotoError::Undecodable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> PhotoLimits {
        PhotoLimits {
            max_pixels: 64 * 32,
            ..PhotoLimits::new(1 << 20, 64)
        }
    }

    fn png(w: u32, h: u32) -> Bytes {
        let mut out = Cursor::new(Vec::new());
        DynamicImage::new_rgb8(w, h)
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        out.into_inner().into()
    }

    /// A zero-filled 16-bit RGBA PNG: a few hundred bytes per megapixel.
    fn png16(w: u32, h: u32) -> Bytes {
        let mut bytes = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut bytes, w, h);
            enc.set_color(png::ColorType::Rgba);
            enc.set_depth(png::BitDepth::Sixteen);
            let mut writer = enc.write_header().unwrap();
            writer
                .write_image_data(&vec![0; w as usize * h as usize * 8])
                .unwrap();
        }
        bytes.into()
    }

    #[tokio::test]
    async fn reencodes_real_images_and_keeps_their_size() {
        let clean = clean(png(10, 5), &limits()).await.unwrap();
        assert_eq!(
            (clean.content_type, clean.width, clean.height),
            ("image/png", 10, 5)
        );
        assert_eq!(image::guess_format(&clean.bytes).unwrap(), ImageFormat::Png);
    }

    #[tokio::test]
    async fn rejects_non_images_and_oversized_images() {
        let limits = limits();
        assert!(matches!(
            clean(Bytes::from_static(b"GIF89a...."), &limits).await,
            Err(PhotoError::UnsupportedFormat)
        ));
        assert!(matches!(
            clean(Bytes::from_static(b"hello"), &limits).await,
            Err(PhotoError::UnsupportedFormat)
        ));
        let mut truncated = png(10, 10).to_vec();
        truncated.truncate(40);
        assert!(matches!(
            clean(truncated.into(), &limits).await,
            Err(PhotoError::Undecodable(_))
        ));
        assert!(matches!(
            clean(png(65, 1), &limits).await,
            Err(PhotoError::TooManyPixels(64))
        ));
        // Each side within 64, but 64 × 33 > 2,048 pixels in all.
        assert!(matches!(
            clean(png(64, 33), &limits).await,
            Err(PhotoError::TooManyPixelsInAll(2048))
        ));
        assert!(clean(png(64, 32), &limits).await.is_ok());
    }

    #[tokio::test]
    async fn a_photo_needing_more_than_the_decode_budget_is_refused_from_its_header() {
        // 2,000 × 2,000 RGBA16 is 32 MB of pixels in a small file.
        let limits = PhotoLimits {
            max_pixels: 10_000_000,
            decode_memory: DecodeMemory::new(16 * MIB),
            ..PhotoLimits::new(1 << 20, 8192)
        };
        let upload = png16(2000, 2000);
        assert!(upload.len() < 200_000, "{} bytes", upload.len());
        let header = inspect(&upload, &limits).unwrap();
        assert!(header.memory > 32_000_000, "{header:?}");
        assert!(matches!(
            clean(upload, &limits).await,
            Err(PhotoError::TooLargeToDecode(_))
        ));
        // With room for it, the same image decodes and comes back 8-bit.
        let roomy = PhotoLimits {
            decode_memory: DecodeMemory::new(128 * MIB),
            ..limits
        };
        let clean = clean(png16(200, 100), &roomy).await.unwrap();
        let back = image::load_from_memory(&clean.bytes).unwrap();
        assert_eq!(back.color(), image::ColorType::Rgba8);
    }

    #[tokio::test]
    async fn decodes_wait_for_their_share_of_the_budget() {
        use futures::FutureExt;
        let memory = DecodeMemory::new(10 * MIB);
        let first = memory.reserve(6 * MIB).await.unwrap();
        // 6 + 6 > 10: the second waits while the first holds its share ...
        let mut second = Box::pin(memory.reserve(6 * MIB));
        assert!((&mut second).now_or_never().is_none());
        // ... and one that could never fit is refused at once.
        assert!(matches!(
            memory.reserve(11 * MIB).await,
            Err(PhotoError::TooLargeToDecode(_))
        ));
        drop(first);
        assert!(second.await.is_ok());
    }

    #[tokio::test]
    async fn the_stored_photo_is_never_larger_than_the_upload_limit() {
        // Noise does not compress: 100 × 100 RGB is ~30 KB as a PNG.
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let noise = image::RgbImage::from_fn(100, 100, |_, _| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            image::Rgb([rng as u8, (rng >> 8) as u8, (rng >> 16) as u8])
        });
        let mut out = Cursor::new(Vec::new());
        noise.write_to(&mut out, ImageFormat::Png).unwrap();
        let upload = Bytes::from(out.into_inner());
        let limits = PhotoLimits::new(10_000, 8192);
        assert!(matches!(
            clean(upload, &limits).await,
            Err(PhotoError::StoredTooLarge(10_000))
        ));
    }

    #[tokio::test]
    async fn strips_text_metadata() {
        // A PNG with a tEXt chunk carrying a fake location.
        let mut bytes = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut bytes, 2, 2);
            enc.set_color(png::ColorType::Rgb);
            enc.add_text_chunk("Location".into(), "51.5N 0.1W secret".into())
                .unwrap();
            enc.write_header()
                .unwrap()
                .write_image_data(&[0; 12])
                .unwrap();
        }
        assert!(bytes.windows(6).any(|w| w == b"secret"));
        let clean = clean(bytes.into(), &limits()).await.unwrap();
        assert!(!clean.bytes.windows(6).any(|w| w == b"secret"));
    }
}
