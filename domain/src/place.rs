//! Where a task is done: its place (a point and a radius), the positions a
//! worker's device reports, the distance between the two, and the cells
//! that index located tasks so that "open tasks nearest first" reads only
//! the tasks near the point, however many there are.
//!
//! A position is evidence, not proof: a browser reports whatever its
//! device (or its user) says. The server records it with the distance and
//! its own time, and marks it as worker-sent, untrusted data.

use geographiclib_rs::{Geodesic, InverseGeodesic};
use serde::{Deserialize, Serialize};

/// Radius of a place when the agent gives none, in metres.
pub const DEFAULT_RADIUS_M: u32 = 100;
/// Largest radius of a place, in metres.
pub const MAX_RADIUS_M: u32 = 50_000;
/// Longest address line, in characters.
pub const MAX_ADDRESS_CHARS: usize = 300;
/// Largest accuracy a position may claim, in metres: a position vaguer
/// than this says nothing about where the worker is.
pub const MAX_ACCURACY_M: f64 = 100_000.0;
/// Largest distance a worker may search for open tasks within, in metres.
pub const MAX_NEARBY_M: u32 = 1_000_000;

/// Where a task is done: within `radius_m` of the point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Location {
    /// WGS 84 latitude in degrees, -90 to 90.
    pub latitude: f64,
    /// WGS 84 longitude in degrees, -180 to 180.
    pub longitude: f64,
    /// Metres around the point that count as on site (1 to 50000; default 100).
    pub radius_m: u32,
    /// An address line for people (the agent's own text, at most 300 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

// Coordinates are finite (checked by `Location::new` and by every decoder),
// so equality is an equivalence.
impl Eq for Location {}

/// What the agent asks of the positions a worker sends when starting the
/// task and with each photo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    /// Positions are recorded when sent, nothing more.
    #[default]
    None,
    /// A position farther than radius + accuracy is recorded as off site.
    Flag,
    /// Starting and photos need a position within radius + accuracy.
    Require,
}

crate::names! {
    Presence {
        None => "none",
        Flag => "flag",
        Require => "require",
    }
}

/// A position a worker's device reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Position {
    /// WGS 84 latitude in degrees, -90 to 90.
    pub latitude: f64,
    /// WGS 84 longitude in degrees, -180 to 180.
    pub longitude: f64,
    /// The device's accuracy in metres (0 to 100000), as the browser reports it.
    pub accuracy_m: f64,
}

/// Why a place or position is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("latitude must be a number from -90 to 90")]
    Latitude,
    #[error("longitude must be a number from -180 to 180")]
    Longitude,
    #[error("radius_m must be from 1 to {MAX_RADIUS_M}")]
    Radius,
    #[error("address must be 1 to {MAX_ADDRESS_CHARS} characters, not blank, without NUL")]
    Address,
    #[error("accuracy_m must be a number from 0 to {MAX_ACCURACY_M}")]
    Accuracy,
}

fn check_point(latitude: f64, longitude: f64) -> Result<(), PlaceError> {
    if !(latitude.is_finite() && (-90.0..=90.0).contains(&latitude)) {
        return Err(PlaceError::Latitude);
    }
    if !(longitude.is_finite() && (-180.0..=180.0).contains(&longitude)) {
        return Err(PlaceError::Longitude);
    }
    Ok(())
}

impl Location {
    /// A checked place; `radius_m` defaults to [`DEFAULT_RADIUS_M`].
    pub fn new(
        latitude: f64,
        longitude: f64,
        radius_m: Option<u32>,
        address: Option<String>,
    ) -> Result<Self, PlaceError> {
        check_point(latitude, longitude)?;
        let radius_m = radius_m.unwrap_or(DEFAULT_RADIUS_M);
        if !(1..=MAX_RADIUS_M).contains(&radius_m) {
            return Err(PlaceError::Radius);
        }
        let address = match address {
            None => None,
            // NUL: PostgreSQL's text cannot hold it, so every surface (the
            // API and a requested task's resource alike) refuses it here.
            Some(a)
                if a.trim().is_empty()
                    || a.chars().count() > MAX_ADDRESS_CHARS
                    || a.contains('\0') =>
            {
                return Err(PlaceError::Address);
            }
            Some(a) => Some(a),
        };
        Ok(Location {
            latitude,
            longitude,
            radius_m,
            address,
        })
    }

    /// The distance from the place's point to `position`, and whether the
    /// position is off site: farther than the radius plus the position's
    /// accuracy (a vague position is given the benefit of the doubt).
    pub fn sighting(&self, position: &Position) -> Sighting {
        let distance_m = distance_m(
            self.latitude,
            self.longitude,
            position.latitude,
            position.longitude,
        );
        Sighting {
            distance_m,
            off_site: distance_m > f64::from(self.radius_m) + position.accuracy_m,
        }
    }
}

impl Position {
    /// A checked position.
    pub fn new(latitude: f64, longitude: f64, accuracy_m: f64) -> Result<Self, PlaceError> {
        check_point(latitude, longitude)?;
        if !(accuracy_m.is_finite() && (0.0..=MAX_ACCURACY_M).contains(&accuracy_m)) {
            return Err(PlaceError::Accuracy);
        }
        Ok(Position {
            latitude,
            longitude,
            accuracy_m,
        })
    }

    /// This position, checked.
    pub fn checked(self) -> Result<Self, PlaceError> {
        Position::new(self.latitude, self.longitude, self.accuracy_m)
    }
}

/// A position compared with a task's place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sighting {
    /// Metres from the place's point, on the WGS 84 ellipsoid.
    pub distance_m: f64,
    /// Farther than the radius plus the position's accuracy.
    pub off_site: bool,
}

/// The geodesic distance between two points on the WGS 84 ellipsoid, in
/// metres (Karney's algorithm: accurate everywhere, poles and the
/// antimeridian included).
pub fn distance_m(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    // The ellipsoid's series coefficients, computed once (building them
    // costs more than a distance).
    static WGS84: std::sync::LazyLock<Geodesic> = std::sync::LazyLock::new(Geodesic::wgs84);
    let s12: f64 = WGS84.inverse(lat1, lon1, lat2, lon2);
    s12
}

/// Whether the second point may be within `radius_m` of the first: false
/// only when it is surely farther. A great-circle distance on a sphere of
/// the Earth's mean radius, which differs from the geodesic one by less
/// than 0.6 %, with a margin of 1 %: a few multiplications, where
/// [`distance_m`] iterates, so a nearby listing measures exactly only the
/// points that can count.
pub fn may_be_within(lat1: f64, lon1: f64, lat2: f64, lon2: f64, radius_m: f64) -> bool {
    const MEAN_RADIUS_M: f64 = 6_371_008.8;
    let (phi1, phi2) = (lat1.to_radians(), lat2.to_radians());
    let (dphi, dlambda) = ((lat2 - lat1).to_radians(), (lon2 - lon1).to_radians());
    let h = (dphi / 2.0).sin().powi(2) + phi1.cos() * phi2.cos() * (dlambda / 2.0).sin().powi(2);
    let sphere_m = 2.0 * MEAN_RADIUS_M * h.sqrt().min(1.0).asin();
    sphere_m <= radius_m * 1.01 + 1.0
}

/// Bits per axis of a cell id: 2^26 rows of latitude and columns of
/// longitude, about 0.3 m by 0.6 m at the equator.
const CELL_BITS: u32 = 26;
/// Most cells a cover is made of: each is one range scan of the index.
/// More cells fit the circle more closely (fewer tasks read for nothing)
/// at the cost of more, shorter scans.
const MAX_COVER_CELLS: usize = 24;

/// The index cell of a point: its row and column on a 2^26 × 2^26 grid of
/// latitude and longitude, bits interleaved (a Z-order code, as a geohash
/// is), so that every coarser cell is one contiguous range of ids and a
/// B-tree on the id finds the tasks in it with one range scan.
pub fn cell_of(latitude: f64, longitude: f64) -> i64 {
    let (row, column) = (grid(latitude, -90.0, 180.0), grid(longitude, -180.0, 360.0));
    interleave(column, row)
}

fn grid(value: f64, min: f64, span: f64) -> u64 {
    let steps = (1u64 << CELL_BITS) as f64;
    (((value - min) / span) * steps)
        .floor()
        .clamp(0.0, steps - 1.0) as u64
}

fn interleave(column: u64, row: u64) -> i64 {
    let mut code = 0u64;
    for bit in 0..CELL_BITS {
        code |= ((column >> bit) & 1) << (2 * bit + 1);
        code |= ((row >> bit) & 1) << (2 * bit);
    }
    code as i64
}

/// Ranges of cell ids (inclusive, ascending, not overlapping) that hold
/// every point within `radius_m` of the given one, and not many more: the
/// finest grid level at which a box around the circle takes at most
/// [`MAX_COVER_CELLS`] cells. Across the antimeridian the box is split in
/// two; a box that reaches a pole takes every longitude.
pub fn cover(latitude: f64, longitude: f64, radius_m: f64) -> Vec<(i64, i64)> {
    // A degree of latitude is at least 110,574 m on WGS 84, and a degree of
    // longitude at latitude φ at least 111,319·cos φ m: dividing by less
    // than either makes the box a little larger than the circle, never
    // smaller.
    let dlat = radius_m / 110_000.0;
    let (lat_lo, lat_hi) = (latitude - dlat, latitude + dlat);
    let mut columns: Vec<(f64, f64)> = Vec::with_capacity(2);
    if lat_lo <= -90.0 || lat_hi >= 90.0 {
        columns.push((-180.0, 180.0));
    } else {
        let widest = lat_lo.abs().max(lat_hi.abs()).to_radians().cos();
        let dlon = radius_m / (110_000.0 * widest);
        if dlon >= 180.0 {
            columns.push((-180.0, 180.0));
        } else {
            let (lo, hi) = (longitude - dlon, longitude + dlon);
            if lo < -180.0 {
                columns.push((lo + 360.0, 180.0));
                columns.push((-180.0, hi));
            } else if hi > 180.0 {
                columns.push((lo, 180.0));
                columns.push((-180.0, hi - 360.0));
            } else {
                columns.push((lo, hi));
            }
        }
    }
    let (lat_lo, lat_hi) = (lat_lo.max(-90.0), lat_hi.min(90.0));
    // The finest level whose cells covering the box are few enough,
    // counted before any is listed.
    let spans = |shift: u32| {
        let rows = (grid(lat_lo, -90.0, 180.0) >> shift)..=(grid(lat_hi, -90.0, 180.0) >> shift);
        let cols: Vec<_> = columns
            .iter()
            .map(|&(lo, hi)| {
                (grid(lo, -180.0, 360.0) >> shift)..=(grid(hi, -180.0, 360.0) >> shift)
            })
            .collect();
        (rows, cols)
    };
    let count = |shift: u32| {
        let (rows, cols) = spans(shift);
        let width: u64 = cols.iter().map(|c| c.end() - c.start() + 1).sum();
        (rows.end() - rows.start() + 1).saturating_mul(width)
    };
    let shift = (0..=CELL_BITS)
        .find(|&shift| count(shift) <= MAX_COVER_CELLS as u64)
        .unwrap_or(CELL_BITS);
    let (rows, cols) = spans(shift);
    let cells: Vec<(u64, u64)> = cols
        .into_iter()
        .flat_map(|c| c.flat_map(|column| rows.clone().map(move |row| (column, row))))
        .collect();
    let span = 1i64 << (2 * shift);
    let mut ranges: Vec<(i64, i64)> = cells
        .into_iter()
        .map(|(column, row)| {
            let first = interleave(column << shift, row << shift);
            (first, first + (span - 1))
        })
        .collect();
    ranges.sort_unstable();
    ranges.dedup();
    let mut merged: Vec<(i64, i64)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1 + 1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use geographiclib_rs::DirectGeodesic;

    /// The point `distance` metres from (lat, lon) along `azimuth`.
    fn toward(lat: f64, lon: f64, azimuth: f64, distance: f64) -> (f64, f64) {
        Geodesic::wgs84().direct(lat, lon, azimuth, distance)
    }

    fn covered(ranges: &[(i64, i64)], lat: f64, lon: f64) -> bool {
        let cell = cell_of(lat, lon);
        ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cell))
    }

    #[test]
    fn distances_are_geodesic() {
        // One degree of latitude at the equator, and across the antimeridian.
        assert!((distance_m(0.0, 0.0, 1.0, 0.0) - 110_574.4).abs() < 1.0);
        let across = distance_m(0.0, 179.999, 0.0, -179.999);
        assert!((across - 222.6).abs() < 0.5, "{across}");
        // Two points near the north pole on opposite meridians.
        let over_the_pole = distance_m(89.999, 0.0, 89.999, 180.0);
        assert!((over_the_pole - 223.4).abs() < 1.0, "{over_the_pole}");
    }

    #[test]
    fn every_point_of_the_circle_is_in_its_cover() {
        let centres = [
            (52.52, 13.405),
            (0.0, 0.0),
            (-33.86, 151.2),
            (0.0, 179.9995),
            (-16.5, -179.99),
            (89.995, 45.0),
            (-89.9, -120.0),
            (64.1, -21.9),
        ];
        for (lat, lon) in centres {
            for radius in [1.0, 150.0, 5_000.0, 80_000.0, 1_000_000.0] {
                let ranges = cover(lat, lon, radius);
                assert!(!ranges.is_empty());
                for step in 0..36 {
                    for fraction in [0.0, 0.5, 0.999] {
                        let (plat, plon) =
                            toward(lat, lon, f64::from(step) * 10.0, radius * fraction);
                        assert!(
                            covered(&ranges, plat, plon),
                            "({plat}, {plon}) is {} m from ({lat}, {lon}) and outside the cover of {radius} m",
                            radius * fraction
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_small_cover_is_small() {
        // 1 km in Berlin: a few fine cells, not a band of the globe.
        let ranges = cover(52.52, 13.405, 1_000.0);
        let cells: i64 = ranges.iter().map(|(lo, hi)| hi - lo + 1).sum();
        let far = cell_of(52.62, 13.405);
        assert!(!ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&far)));
        assert!(cells < 1 << 30, "{cells}");
        assert!(ranges.len() <= MAX_COVER_CELLS);
    }

    #[test]
    fn places_and_positions_are_checked() {
        assert_eq!(
            Location::new(91.0, 0.0, None, None),
            Err(PlaceError::Latitude)
        );
        assert_eq!(
            Location::new(f64::NAN, 0.0, None, None),
            Err(PlaceError::Latitude)
        );
        assert_eq!(
            Location::new(0.0, -180.5, None, None),
            Err(PlaceError::Longitude)
        );
        assert_eq!(
            Location::new(0.0, 0.0, Some(0), None),
            Err(PlaceError::Radius)
        );
        assert_eq!(
            Location::new(0.0, 0.0, Some(MAX_RADIUS_M + 1), None),
            Err(PlaceError::Radius)
        );
        assert_eq!(
            Location::new(0.0, 0.0, None, Some(" ".into())),
            Err(PlaceError::Address)
        );
        let place = Location::new(52.52, 13.405, None, Some("Alexanderplatz".into())).unwrap();
        assert_eq!(place.radius_m, DEFAULT_RADIUS_M);
        assert_eq!(Position::new(0.0, 0.0, -1.0), Err(PlaceError::Accuracy));
        assert_eq!(
            Position::new(0.0, 0.0, f64::INFINITY),
            Err(PlaceError::Accuracy)
        );
    }

    #[test]
    fn off_site_counts_the_radius_and_the_accuracy() {
        let place = Location::new(52.52, 13.405, Some(100), None).unwrap();
        let (lat, lon) = toward(52.52, 13.405, 90.0, 150.0);
        let near = place.sighting(&Position::new(lat, lon, 60.0).unwrap());
        assert!((near.distance_m - 150.0).abs() < 0.01);
        assert!(!near.off_site, "150 m is within 100 m + 60 m");
        let far = place.sighting(&Position::new(lat, lon, 40.0).unwrap());
        assert!(far.off_site, "150 m is beyond 100 m + 40 m");
    }

    #[test]
    fn the_quick_bound_never_drops_a_point_within_the_radius() {
        // Points at many bearings and distances, at the equator, at middle
        // latitudes, near a pole and across the antimeridian: whenever the
        // geodesic distance is within a radius, so is the bound.
        let origins = [
            (0.0, 0.0),
            (51.0, 10.0),
            (-33.9, 18.4),
            (89.5, 0.0),
            (10.0, 179.9),
        ];
        for (lat, lon) in origins {
            for step in 0..360 {
                let bearing = f64::from(step);
                for metres in [1.0, 90.0, 1_000.0, 25_000.0, 400_000.0, 999_000.0] {
                    let (lat2, lon2, _): (f64, f64, f64) = {
                        use geographiclib_rs::DirectGeodesic;
                        Geodesic::wgs84().direct(lat, lon, bearing, metres)
                    };
                    let d = distance_m(lat, lon, lat2, lon2);
                    assert!(
                        may_be_within(lat, lon, lat2, lon2, d),
                        "{lat},{lon} -> {lat2},{lon2}"
                    );
                    assert!(!may_be_within(lat, lon, lat2, lon2, d * 0.98 - 2.0) || d < 100.0);
                }
            }
        }
    }

    #[test]
    fn an_address_with_nul_is_refused() {
        let with_nul = Some("Rathausplatz 1\0".to_owned());
        assert_eq!(
            Location::new(52.5, 13.4, None, with_nul),
            Err(PlaceError::Address)
        );
        assert!(Location::new(52.5, 13.4, None, Some("Rathausplatz 1".into())).is_ok());
    }
}
