//! Worker photos: the upload is decoded (so only real images get in),
//! bounded in size and dimensions, turned upright, and re-encoded, which
//! drops every byte of metadata (EXIF location, camera serials, comments).

use std::io::Cursor;

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

/// Bounds on an upload.
#[derive(Debug, Clone, Copy)]
pub struct PhotoLimits {
    /// Largest upload in bytes.
    pub max_bytes: usize,
    /// Largest width or height in pixels.
    pub max_dimension: u32,
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
    #[error("the image could not be re-encoded: {0}")]
    Encode(String),
}

/// Decodes `bytes`, checks them and re-encodes them in the same format.
pub fn clean(bytes: &[u8], limits: PhotoLimits) -> Result<CleanPhoto, PhotoError> {
    let format = image::guess_format(bytes).map_err(|_| PhotoError::UnsupportedFormat)?;
    let content_type = match format {
        ImageFormat::Jpeg => "image/jpeg",
        ImageFormat::Png => "image/png",
        ImageFormat::WebP => "image/webp",
        _ => return Err(PhotoError::UnsupportedFormat),
    };
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut image_limits = Limits::default();
    image_limits.max_image_width = Some(limits.max_dimension);
    image_limits.max_image_height = Some(limits.max_dimension);
    image_limits.max_alloc = Some(512 * 1024 * 1024);
    reader.limits(image_limits);
    let mut decoder = reader.into_decoder().map_err(decode_error(limits))?;
    let orientation = decoder.orientation().map_err(decode_error(limits))?;
    let mut img = DynamicImage::from_decoder(decoder).map_err(decode_error(limits))?;
    img.apply_orientation(orientation);

    let mut out = Cursor::new(Vec::new());
    match format {
        ImageFormat::Jpeg => {
            let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
            DynamicImage::ImageRgb8(img.to_rgb8()).write_with_encoder(encoder)
        }
        ImageFormat::Png => img.write_to(&mut out, ImageFormat::Png),
        _ => {
            let encoder = image::codecs::webp::WebPEncoder::new_lossless(&mut out);
            let rgba = DynamicImage::ImageRgba8(img.to_rgba8());
            rgba.write_with_encoder(encoder)
        }
    }
    .map_err(|e| PhotoError::Encode(e.to_string()))?;
    Ok(CleanPhoto {
        content_type,
        width: img.width(),
        height: img.height(),
        bytes: out.into_inner(),
    })
}

fn decode_error(limits: PhotoLimits) -> impl Fn(image::ImageError) -> PhotoError {
    move |e| match e {
        image::ImageError::Limits(_) => PhotoError::TooManyPixels(limits.max_dimension),
        other => PhotoError::Undecodable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PhotoLimits = PhotoLimits {
        max_bytes: 1 << 20,
        max_dimension: 64,
    };

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        DynamicImage::new_rgb8(w, h)
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn reencodes_real_images_and_keeps_their_size() {
        let clean = clean(&png(10, 5), LIMITS).unwrap();
        assert_eq!(
            (clean.content_type, clean.width, clean.height),
            ("image/png", 10, 5)
        );
        assert_eq!(image::guess_format(&clean.bytes).unwrap(), ImageFormat::Png);
    }

    #[test]
    fn rejects_non_images_and_oversized_images() {
        assert!(matches!(
            clean(b"GIF89a....", LIMITS),
            Err(PhotoError::UnsupportedFormat)
        ));
        assert!(matches!(
            clean(b"hello", LIMITS),
            Err(PhotoError::UnsupportedFormat)
        ));
        let mut truncated = png(10, 10);
        truncated.truncate(40);
        assert!(matches!(
            clean(&truncated, LIMITS),
            Err(PhotoError::Undecodable(_))
        ));
        assert!(matches!(
            clean(&png(65, 1), LIMITS),
            Err(PhotoError::TooManyPixels(64))
        ));
    }

    #[test]
    fn strips_text_metadata() {
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
        let clean = clean(&bytes, LIMITS).unwrap();
        assert!(!clean.bytes.windows(6).any(|w| w == b"secret"));
    }
}
