//! Requests the server makes to addresses a device gave it (push endpoints). A device must not
//! turn the server into a scanner of its own network: only public addresses are reached,
//! checked when connecting (the resolver drops every other address, so a name that resolves
//! differently later — DNS rebinding — cannot get round it), no redirects are followed, no
//! credentials ride in the URL, and failures are told back only as coarse classes. The
//! operator may allow-list networks (`serve --push-allow`), e.g. a self-hosted ntfy on a LAN.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

/// The networks the operator allowed besides the public internet.
#[derive(Debug, Clone, Default)]
pub struct Allowed(pub Vec<IpNet>);

impl Allowed {
    /// Whether the server may connect to `ip`: a public address, or one in an allowed network.
    pub fn reaches(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.listed(ip)
    }

    /// Whether `ip` is in a network the operator allowed.
    pub fn listed(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|n| n.contains(&ip))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Whether an address is on the public internet: not loopback, private, shared (CGNAT),
/// link-local, unspecified, broadcast, multicast, documentation, benchmarking or reserved, nor
/// an IPv6 form that embeds such an IPv4 address (mapped, NAT64, 6to4).
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (RFC 6598)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking (RFC 2544)
        || a >= 240) // reserved
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return public_v4(embedded(s[6], s[7])); // NAT64 (RFC 6052)
    }
    if s[0] == 0x2002 {
        return public_v4(embedded(s[1], s[2])); // 6to4
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x2001 && s[1] < 0x0200) // IETF protocol assignments (Teredo, ORCHID…)
        || s[..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible (deprecated)
}

/// Why an endpoint cannot be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("`{0}` is not an http(s) URL")]
    NotHttp(String),
    #[error("an endpoint must not carry a user name or password")]
    Credentials,
    #[error("a Web Push endpoint must use https")]
    NotHttps,
    #[error(
        "the endpoint's address is not public; a push service on this network must be allowed by the operator (`waymark serve --push-allow CIDR`)"
    )]
    NotPublic,
}

/// Checks an endpoint a device registers: http(s) of sane length, no user info, `https` for
/// Web Push (unless its address is allow-listed), and an address literal only when the server
/// may reach it. A name is checked again at every connection ([`client`]).
pub fn check_endpoint(
    endpoint: &str,
    web_push: bool,
    allowed: &Allowed,
) -> Result<url::Url, EndpointError> {
    let url = url::Url::parse(endpoint)
        .ok()
        .filter(|u| {
            matches!(u.scheme(), "http" | "https") && endpoint.len() <= 2048 && u.host().is_some()
        })
        .ok_or_else(|| EndpointError::NotHttp(crate::text::clip(endpoint, 200)))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(EndpointError::Credentials);
    }
    let literal = literal_ip(&url);
    if let Some(ip) = literal
        && !allowed.reaches(ip)
    {
        return Err(EndpointError::NotPublic);
    }
    if web_push && url.scheme() != "https" && !literal.is_some_and(|ip| allowed.listed(ip)) {
        return Err(EndpointError::NotHttps);
    }
    Ok(url)
}

/// The address a URL names literally (the WHATWG parser has already turned decimal, octal and
/// hex forms into one).
pub fn literal_ip(url: &url::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

/// Resolves names to the addresses the server may reach, and none else.
struct PublicOnly(Arc<Allowed>);

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.0.clone();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let ok: Vec<SocketAddr> = all
                .into_iter()
                .filter(|a| allowed.reaches(a.ip()))
                .collect();
            if ok.is_empty() {
                return Err(Box::new(Blocked) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(ok.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A name that resolved only to addresses the server may not reach.
#[derive(Debug, thiserror::Error)]
#[error("the address is not public")]
pub struct Blocked;

/// How long connecting to a push service may take…
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// …and the whole request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The client for endpoints devices gave: public addresses only (by its resolver; address
/// literals are checked by the caller with [`literal_ip`]), no redirects, no proxies from the
/// environment, short timeouts.
pub fn client(allowed: Arc<Allowed>) -> reqwest::Client {
    reqwest::Client::builder()
        .dns_resolver(Arc::new(PublicOnly(allowed)))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// A failed request as the device is told it: a class, never the network's own words.
pub fn failure_class(e: &reqwest::Error) -> &'static str {
    let blocked = std::iter::successors(Some(e as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .any(|e| e.is::<Blocked>());
    if blocked {
        "the push service's address is not public (the operator can allow it: `serve --push-allow`)"
    } else if e.is_timeout() {
        "the push service did not answer in time"
    } else {
        "could not reach the push service"
    }
}

/// A push service's answer as the device is told it.
pub fn status_class(status: reqwest::StatusCode) -> &'static str {
    match status.as_u16() {
        300..=399 => "the push service redirected (not followed)",
        400..=499 => "the push service refused the push (4xx)",
        _ => "the push service failed (5xx)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.2.1",
            "198.18.0.1",
            "240.0.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "2001:db8::1",
            "::127.0.0.1",
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::101:101",
        ] {
            assert!(is_public(ip(public)), "{public}");
        }
    }

    #[test]
    fn an_endpoint_is_refused_for_what_it_names_not_for_how_it_spells_it() {
        let none = Allowed::default();
        for (url, want) in [
            ("http://2130706433/push", EndpointError::NotPublic),
            ("http://0x7f.1/push", EndpointError::NotPublic),
            ("http://017700000001/push", EndpointError::NotPublic),
            (
                "https://[::ffff:169.254.169.254]/x",
                EndpointError::NotPublic,
            ),
            ("http://10.0.0.1:8080/x", EndpointError::NotPublic),
            (
                "https://user:pass@push.example.com/x",
                EndpointError::Credentials,
            ),
            (
                "ftp://push.example.com/x",
                EndpointError::NotHttp("ftp://push.example.com/x".into()),
            ),
        ] {
            assert_eq!(
                check_endpoint(url, false, &none).unwrap_err(),
                want,
                "{url}"
            );
        }
        assert_eq!(
            check_endpoint("http://push.example.com/x", true, &none).unwrap_err(),
            EndpointError::NotHttps
        );
        assert!(check_endpoint("https://push.example.com/x", true, &none).is_ok());
        assert!(check_endpoint("http://ntfy.example.com/x", false, &none).is_ok());
        // The operator's LAN ntfy, allowed by network; plain http to it even for Web Push.
        let lan = Allowed(vec!["192.168.1.0/24".parse().unwrap()]);
        assert!(check_endpoint("http://192.168.1.10/up", false, &lan).is_ok());
        assert!(check_endpoint("http://192.168.1.10/wp", true, &lan).is_ok());
        assert_eq!(
            check_endpoint("http://192.168.2.10/up", false, &lan).unwrap_err(),
            EndpointError::NotPublic
        );
    }
}
