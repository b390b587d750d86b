//! Which URLs a task may name as its webhook: checked when the task is
//! created (by the API server) and again, after DNS resolution, before every
//! delivery (by the controller), so both ask this one module.
//!
//! Safe by default (SSRF): only `http` and `https`, and only globally
//! routable unicast addresses ([`is_public`], an allow-list: IPv6 inside
//! `2000::/3` only, IPv4 outside every special-purpose block, and an IPv4
//! address embedded in IPv6 — mapped, compatible, 6to4, Teredo — checked as
//! IPv4). Loopback, private, unique and site-local, link-local (which holds
//! the cloud metadata address 169.254.169.254), carrier-grade NAT,
//! unspecified, multicast, broadcast and documentation addresses are
//! refused unless an [`AllowList`] of CIDRs in configuration
//! (`MEATSPACE_WEBHOOK_ALLOW`, e.g. `127.0.0.1/32`) permits them.
//!
//! Pure: name resolution is the caller's, passed to [`check_url`] as a
//! function, so the domain performs no I/O (an IP literal is checked
//! without calling it).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;
pub use url::Url;

/// Longest webhook URL.
pub const MAX_URL_LEN: usize = 2048;

/// Non-public networks that configuration allows as webhook destinations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<IpNet>);

impl FromStr for AllowList {
    type Err = String;

    /// Comma-separated CIDRs or addresses (`127.0.0.1/32,10.1.0.0/16,::1`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut nets = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let net = part
                .parse::<IpNet>()
                .or_else(|_| part.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{part:?} is not a CIDR or an IP address"))?;
            nets.push(net);
        }
        Ok(AllowList(nets))
    }
}

impl AllowList {
    /// True when a delivery may go to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        is_public(ip) || self.0.iter().any(|n| n.contains(&ip))
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Globally routable unicast addresses: the only destinations a webhook
/// may reach without the allow-list.
///
/// This is an allow-list, not a list of known-bad ranges: an IPv6 address
/// passes only inside global unicast `2000::/3`, minus the special-purpose
/// blocks in it; an IPv4 address only outside every special-purpose block
/// of the IANA registry. Addresses that carry an IPv4 address inside
/// (IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96`, 6to4
/// `2002::/16`, Teredo `2001::/32`) pass only when every embedded IPv4
/// address does, because a relay or a dual-stack host delivers them there.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    // The special-purpose blocks of the IANA IPv4 registry (RFC 6890 and
    // its updates) and multicast: none is globally routable unicast.
    let special = a == 0 // "this network" 0.0.0.0/8
        || a == 10 // private
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT 100.64.0.0/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, the cloud metadata address
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation TEST-NET-1
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast (deprecated)
        || (a == 192 && b == 168) // private
        || (a == 198 && (18..20).contains(&b)) // benchmarking 198.18.0.0/15
        || (a == 198 && b == 51 && c == 100) // documentation TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // documentation TEST-NET-3
        || a >= 224; // multicast 224/4, reserved 240/4, broadcast
    !special
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d (which
    // includes :: and ::1, whose IPv4 reading is in 0.0.0.0/8).
    if s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff) {
        return is_public_v4(embedded(s[6], s[7]));
    }
    // Only global unicast 2000::/3 is routable on the internet.
    if s[0] & 0xe000 != 0x2000 {
        return false;
    }
    match s[0] {
        // 6to4: the IPv4 address of the site in bits 16..48.
        0x2002 => is_public_v4(embedded(s[1], s[2])),
        0x2001 => match s[1] {
            // Teredo: the server's IPv4 address in bits 32..64, the
            // client's, inverted, in bits 96..128.
            0x0000 => is_public_v4(embedded(s[2], s[3])) && is_public_v4(embedded(!s[6], !s[7])),
            // Documentation 2001:db8::/32.
            0x0db8 => false,
            // The rest of the IETF protocol assignments 2001::/23
            // (benchmarking, ORCHID, AMT, ...) is not globally reachable
            // unicast.
            x => x >= 0x0200,
        },
        // Documentation 3fff::/20 (RFC 9637).
        0x3fff => s[1] >= 0x1000,
        _ => true,
    }
}

/// Why a webhook URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("webhook_url is not a valid absolute URL")]
    Malformed,
    #[error("webhook_url must use http or https")]
    Scheme,
    #[error("webhook_url must not carry a user name or password")]
    Credentials,
    #[error("webhook_url is longer than {MAX_URL_LEN} characters")]
    TooLong,
    #[error("webhook_url's host does not resolve")]
    Unresolvable,
    #[error(
        "webhook_url resolves to {0}, which is not a public address (loopback, private, link-local or metadata); \
         the server's webhook allow-list does not permit it"
    )]
    NotPublic(IpAddr),
}

/// Checks the form of a webhook URL (scheme, host, length), without any
/// network access.
pub fn parse_url(raw: &str) -> Result<Url, UrlRefused> {
    if raw.len() > MAX_URL_LEN {
        return Err(UrlRefused::TooLong);
    }
    let url = Url::parse(raw).map_err(|_| UrlRefused::Malformed)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlRefused::Scheme);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlRefused::Credentials);
    }
    if url.host().is_none() {
        return Err(UrlRefused::Malformed);
    }
    Ok(url)
}

/// Checks a webhook URL completely: its form, and that every address its
/// host resolves to is permitted. An IP literal is checked as is; a name is
/// passed to `resolve` (with the URL's port), which answers the addresses it
/// resolves to (a DNS query, never a connection).
pub async fn check_url<F, Fut>(raw: &str, allow: &AllowList, resolve: F) -> Result<Url, UrlRefused>
where
    F: FnOnce(String, u16) -> Fut,
    Fut: Future<Output = std::io::Result<Vec<IpAddr>>>,
{
    let url = parse_url(raw)?;
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<IpAddr> = match url.host() {
        Some(url::Host::Ipv4(v4)) => vec![IpAddr::V4(v4)],
        Some(url::Host::Ipv6(v6)) => vec![IpAddr::V6(v6)],
        Some(url::Host::Domain(name)) => resolve(name.to_owned(), port)
            .await
            .map_err(|_| UrlRefused::Unresolvable)?,
        None => return Err(UrlRefused::Malformed),
    };
    if addrs.is_empty() {
        return Err(UrlRefused::Unresolvable);
    }
    if let Some(bad) = addrs.into_iter().find(|ip| !allow.permits(*ip)) {
        return Err(UrlRefused::NotPublic(bad));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A resolver for URLs whose host is an IP literal: never called.
    async fn no_lookup(name: String, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        panic!("{name} was resolved, but a literal needs no lookup")
    }

    #[test]
    fn only_public_addresses_pass_by_default() {
        let none = AllowList::default();
        for bad in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!none.permits(ip(bad)), "{bad} must be refused");
        }
        for good in ["93.184.216.34", "1.1.1.1", "2606:4700::1111"] {
            assert!(none.permits(ip(good)), "{good} is public");
        }
    }

    #[test]
    fn embedded_and_special_ipv6_ranges_are_refused() {
        let none = AllowList::default();
        for bad in [
            // The review's examples: IPv4-compatible loopback, site-local,
            // 6to4 of loopback.
            "::127.0.0.1",
            "fec0::1",
            "2002:7f00:1::",
            // 6to4 of private and metadata addresses.
            "2002:a00:1::1",
            "2002:a9fe:a9fe::1",
            // Teredo whose client (inverted 127.0.0.1) or server is internal.
            "2001:0:5ef5:79fd:0:0:80ff:fffe",
            "2001:0:a00:1:0:0:a2c1:1f1e",
            // IPv4-compatible private, NAT64 of loopback, documentation,
            // ORCHID, discard-only, IPv4-mapped metadata, multicast.
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "2001:db8::1",
            "3fff::1",
            "2001:10::1",
            "100::1",
            "::ffff:169.254.169.254",
            "ff02::1",
            "fc00::1",
            "4000::1",
        ] {
            assert!(!none.permits(ip(bad)), "{bad} must be refused");
        }
        for good in [
            // 6to4 and Teredo of public addresses, IPv4-compatible public.
            "2002:5db8:d822::1",
            "2001:0:5ef5:79fd:0:0:a2c1:1f1e",
            "::93.184.216.34",
            "::ffff:1.1.1.1",
            "2a00:1450:4001:82b::200e",
            "3fff:1000::1",
        ] {
            assert!(none.permits(ip(good)), "{good} is globally routable");
        }
    }

    #[test]
    fn special_ipv4_ranges_are_refused() {
        let none = AllowList::default();
        for bad in [
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "240.0.0.1",
            "0.1.2.3",
        ] {
            assert!(!none.permits(ip(bad)), "{bad} must be refused");
        }
        for good in ["8.8.8.8", "100.128.0.1", "172.32.0.1", "192.0.3.1"] {
            assert!(none.permits(ip(good)), "{good} is public");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_its_networks() {
        let allow: AllowList = "127.0.0.1/32, 10.1.0.0/16,::1".parse().unwrap();
        assert!(allow.permits(ip("127.0.0.1")));
        assert!(!allow.permits(ip("127.0.0.2")));
        assert!(allow.permits(ip("10.1.2.3")));
        assert!(!allow.permits(ip("10.2.0.1")));
        assert!(allow.permits(ip("::1")));
        assert!("nonsense".parse::<AllowList>().is_err());
        assert_eq!("".parse::<AllowList>().unwrap(), AllowList::default());
    }

    #[tokio::test]
    async fn urls_are_checked_without_traffic_for_literals() {
        let none = AllowList::default();
        assert_eq!(
            check_url("http://127.0.0.1:9/x", &none, no_lookup)
                .await
                .unwrap_err(),
            UrlRefused::NotPublic(ip("127.0.0.1"))
        );
        assert_eq!(
            check_url("https://10.0.0.1/", &none, no_lookup)
                .await
                .unwrap_err(),
            UrlRefused::NotPublic(ip("10.0.0.1"))
        );
        assert_eq!(
            check_url("ftp://93.184.216.34/", &none, no_lookup)
                .await
                .unwrap_err(),
            UrlRefused::Scheme
        );
        assert_eq!(
            check_url("http://u:p@93.184.216.34/", &none, no_lookup)
                .await
                .unwrap_err(),
            UrlRefused::Credentials
        );
        assert_eq!(
            check_url("not a url", &none, no_lookup).await.unwrap_err(),
            UrlRefused::Malformed
        );
        let local: AllowList = "127.0.0.1/32".parse().unwrap();
        assert!(
            check_url("http://127.0.0.1:9/hook", &local, no_lookup)
                .await
                .is_ok()
        );
        assert!(
            check_url("http://93.184.216.34/hook", &none, no_lookup)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_name_is_checked_by_every_address_it_resolves_to() {
        let none = AllowList::default();
        let resolves_to = |addrs: Vec<IpAddr>| {
            move |name: String, port: u16| async move {
                assert_eq!((name.as_str(), port), ("hooks.example", 8443));
                Ok(addrs)
            }
        };
        let url = "https://hooks.example:8443/in";
        assert!(
            check_url(url, &none, resolves_to(vec![ip("93.184.216.34")]))
                .await
                .is_ok()
        );
        assert_eq!(
            check_url(
                url,
                &none,
                resolves_to(vec![ip("93.184.216.34"), ip("10.0.0.1")])
            )
            .await
            .unwrap_err(),
            UrlRefused::NotPublic(ip("10.0.0.1"))
        );
        assert_eq!(
            check_url(url, &none, resolves_to(vec![]))
                .await
                .unwrap_err(),
            UrlRefused::Unresolvable
        );
        let fails = |_: String, _: u16| async {
            Err::<Vec<IpAddr>, _>(std::io::Error::other("no such host"))
        };
        assert_eq!(
            check_url(url, &none, fails).await.unwrap_err(),
            UrlRefused::Unresolvable
        );
    }
}
