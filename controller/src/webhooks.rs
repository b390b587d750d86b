//! Webhook destinations: which URLs a task may name, checked when the task
//! is created and again, after DNS resolution, before every delivery.
//!
//! Safe by default (SSRF): only `http` and `https`, and only addresses on
//! the public internet. Loopback, private (RFC 1918, unique local),
//! link-local (which holds the cloud metadata address 169.254.169.254),
//! carrier-grade NAT, unspecified, multicast, broadcast and documentation
//! addresses are refused unless an [`AllowList`] of CIDRs in configuration
//! (`MEATSPACE_WEBHOOK_ALLOW`, e.g. `127.0.0.1/32`) permits them. Checking
//! at delivery time after resolution (the client's resolver drops every
//! address that is not allowed) defeats a name that resolved to a public
//! address at creation and to an internal one later.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use std::time::Duration;

use ipnet::IpNet;
use meatspace_core::secret::ServerKey;
use reqwest::Url;

/// How webhooks are delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// Non-public destinations allowed.
    pub allow: AllowList,
    /// First retry delay; doubled per failed attempt, with jitter.
    pub retry_base: Duration,
    /// Longest delay between two attempts.
    pub retry_max: Duration,
    /// An endpoint failing for this long is disabled.
    pub give_up_after: Duration,
    /// Longest time one attempt may take.
    pub timeout: Duration,
    /// Derives each task's signing secret; without it nothing is delivered.
    pub server_key: Option<ServerKey>,
}

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

/// Addresses on the public internet.
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        // Carrier-grade NAT 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments 192.0.0.0/24, benchmarking 198.18.0.0/15.
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (18..20).contains(&b))
        // Reserved 240.0.0.0/4.
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // Unique local fc00::/7 (includes the fd00:ec2::254 metadata address).
        || (first & 0xfe00) == 0xfc00
        // Link-local fe80::/10.
        || (first & 0xffc0) == 0xfe80
        // Documentation 2001:db8::/32.
        || (first == 0x2001 && ip.segments()[1] == 0x0db8)
        // NAT64 64:ff9b::/96 can reach IPv4 private space.
        || (first == 0x0064 && ip.segments()[1] == 0xff9b))
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
/// host resolves to is permitted. An IP literal is checked without any
/// network access; a name is resolved (a DNS query, never a connection).
pub async fn check_url(raw: &str, allow: &AllowList) -> Result<Url, UrlRefused> {
    let url = parse_url(raw)?;
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<IpAddr> = match url.host() {
        Some(url::Host::Ipv4(v4)) => vec![IpAddr::V4(v4)],
        Some(url::Host::Ipv6(v6)) => vec![IpAddr::V6(v6)],
        Some(url::Host::Domain(name)) => tokio::net::lookup_host((name, port))
            .await
            .map_err(|_| UrlRefused::Unresolvable)?
            .map(|a| a.ip())
            .collect(),
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
            check_url("http://127.0.0.1:9/x", &none).await.unwrap_err(),
            UrlRefused::NotPublic(ip("127.0.0.1"))
        );
        assert_eq!(
            check_url("https://10.0.0.1/", &none).await.unwrap_err(),
            UrlRefused::NotPublic(ip("10.0.0.1"))
        );
        assert_eq!(
            check_url("ftp://93.184.216.34/", &none).await.unwrap_err(),
            UrlRefused::Scheme
        );
        assert_eq!(
            check_url("http://u:p@93.184.216.34/", &none)
                .await
                .unwrap_err(),
            UrlRefused::Credentials
        );
        assert_eq!(
            check_url("not a url", &none).await.unwrap_err(),
            UrlRefused::Malformed
        );
        let local: AllowList = "127.0.0.1/32".parse().unwrap();
        assert!(check_url("http://127.0.0.1:9/hook", &local).await.is_ok());
        assert!(check_url("http://93.184.216.34/hook", &none).await.is_ok());
    }
}
