use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{FORWARDED, HeaderName};
use http::{Request, StatusCode};

use super::{Extracted, KeyExtractor, KeyRejection};
use crate::store::build_error::BuildError;
use crate::store::caller::Caller;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Counts callers by client IP address, honouring forwarding headers only from trusted
/// proxies.
///
/// The peer address comes from axum's `ConnectInfo<SocketAddr>` (serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`), from tonic's `TcpConnectInfo`
/// (with the `tonic` feature: a layer on tonic's own `Server`, which records it for every
/// request; a TLS server's `TlsConnectInfo` is not read), or, for plain hyper services,
/// from a [`SocketAddr`] in the request's extensions. A request without any has no key (see
/// [`MissingKey`](crate::key::MissingKey)); the first such request logs one warning (per
/// extractor and its clones) that says how to fix the server.
///
/// - A peer that is not a trusted proxy is the client; its forwarding headers are ignored,
///   so a client cannot spoof its address.
/// - A trusted peer's forwarding header is read from right to left, skipping trusted
///   proxies; the first untrusted address is the client. The header is X-Forwarded-For by
///   default; [`ClientIp::forwarded_header`] chooses RFC 7239 Forwarded, or another header
///   holding a list of addresses or just one (`X-Real-IP`, `CF-Connecting-IP`). A request
///   whose chain holds only trusted addresses, or `unknown`, has no key (the load
///   balancer's own address is never used); an entry that is not an address is rejected
///   with 400. Entries are decoded one at a time and only as far as needed:
///   whatever lies left of the client's address (written by the client itself, any bytes at
///   all) is never read. Several lines of the header count as one list, in order.
/// - IPv6 clients are grouped by their /64 network by default (one host usually owns a
///   whole /64); see [`ClientIp::ipv6_prefix`]. IPv4-mapped IPv6 addresses count as IPv4.
///
/// ```
/// use http::header::FORWARDED;
/// use tollgate::key::ClientIp;
///
/// let behind_lb = ClientIp::new()
///     .trusted_proxies(["10.0.0.0/8", "fd00::/8"])?
///     .forwarded_header(FORWARDED);
/// assert!(behind_lb.trusts("10.1.2.3".parse().unwrap()));
/// # Ok::<(), tollgate::BuildError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: TrustedProxies,
    header: HeaderName,
    grammar: Grammar,
    ipv6_prefix: u8,
    /// Set once the missing peer address has been reported; shared by clones.
    warned_no_peer: Arc<AtomicBool>,
}

/// How the forwarding header's entries are written: decided once, from the header's name,
/// so that no request compares names.
#[derive(Clone, Copy, Debug)]
enum Grammar {
    /// Bare addresses, `client, proxy1, proxy2`, as X-Forwarded-For writes them (a
    /// single-address header is a list of one).
    AddressList,
    /// RFC 7239 forwarded-elements, `for=client, for=proxy1;proto=https`.
    Forwarded,
}

impl Grammar {
    fn of(name: &HeaderName) -> Self {
        if name == FORWARDED {
            Grammar::Forwarded
        } else {
            Grammar::AddressList
        }
    }
}

impl ClientIp {
    /// Keys on the peer address, trusting no proxy.
    pub fn new() -> Self {
        Self {
            trusted: TrustedProxies::default(),
            header: X_FORWARDED_FOR,
            grammar: Grammar::AddressList,
            ipv6_prefix: 64,
            warned_no_peer: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Trusts the forwarding headers of peers in these networks, given as CIDR blocks
    /// (`10.0.0.0/8`, `fd00::/8`; a bare address is a single host), in place of any
    /// trusted before. A block that does not parse is an error naming it, so an address
    /// list read from configuration fails at start-up rather than trusting less than meant.
    ///
    /// ```
    /// use tollgate::{BuildError, key::ClientIp};
    ///
    /// let ip = ClientIp::new().trusted_proxies(["10.0.0.0/8", "2001:db8::/32", "192.0.2.1"])?;
    /// assert!(ip.trusts("10.1.2.3".parse().unwrap()));
    /// assert!(!ip.trusts("11.0.0.1".parse().unwrap()));
    /// assert_eq!(
    ///     ClientIp::new().trusted_proxies(["10.0.0.0/33"]).unwrap_err(),
    ///     BuildError::InvalidCidr { block: "10.0.0.0/33".into() },
    /// );
    /// # Ok::<(), BuildError>(())
    /// ```
    pub fn trusted_proxies<I, S>(mut self, blocks: I) -> Result<Self, BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.trusted = TrustedProxies::parse(blocks)?;
        Ok(self)
    }

    /// Whether `addr` lies in one of the trusted proxies' networks.
    pub fn trusts(&self, addr: IpAddr) -> bool {
        self.trusted.contains(addr)
    }

    /// Chooses the header in which the trusted proxies write the client's address;
    /// `x-forwarded-for` is the default.
    ///
    /// - [`FORWARDED`](http::header::FORWARDED) is read as RFC 7239 says: the `for=`
    ///   parameter of each forwarded-element (`for="[2001:db8::1]:4711";proto=https`).
    /// - Any other header is read as X-Forwarded-For is: a comma-separated list of addresses
    ///   (`client, proxy1, proxy2`, ports and brackets allowed), right to left through the
    ///   trusted proxies. A header in which a load balancer writes only the client's address
    ///   (`cf-connecting-ip`, `x-real-ip`, `true-client-ip`) is a list of one.
    ///
    /// Name only a header that every trusted proxy writes (replacing the client's value, or
    /// appending to it): one they pass through untouched holds whatever the client wrote.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use http::HeaderName;
    /// use http::header::FORWARDED;
    /// use tollgate::key::ClientIp;
    ///
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert("10.0.0.9:41000".parse::<SocketAddr>().unwrap());
    /// let headers = request.headers_mut();
    /// headers.insert("x-forwarded-for", "198.51.100.1, 10.0.0.4".parse().unwrap());
    /// headers.insert(FORWARDED, "for=198.51.100.2;proto=https".parse().unwrap());
    /// headers.insert("cf-connecting-ip", "198.51.100.3".parse().unwrap());
    ///
    /// let behind_lb = ClientIp::new().trusted_proxies(["10.0.0.0/8"])?;
    /// let client = |ip: &ClientIp| ip.client_addr(&request).unwrap().unwrap().to_string();
    /// assert_eq!(client(&behind_lb), "198.51.100.1");
    /// assert_eq!(client(&behind_lb.clone().forwarded_header(FORWARDED)), "198.51.100.2");
    /// let cloudflare = behind_lb.forwarded_header(HeaderName::from_static("cf-connecting-ip"));
    /// assert_eq!(client(&cloudflare), "198.51.100.3");
    /// # Ok::<(), tollgate::BuildError>(())
    /// ```
    pub fn forwarded_header(mut self, name: HeaderName) -> Self {
        self.grammar = Grammar::of(&name);
        self.header = name;
        self
    }

    /// Groups IPv6 clients by a network prefix of this many bits (default 64; 128 keys
    /// every address apart). Values above 128 are taken as 128.
    ///
    /// ```
    /// let per_address = tollgate::key::ClientIp::new().ipv6_prefix(128);
    /// # drop(per_address);
    /// ```
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// The client address of `request` as this extractor sees it, before grouping.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use tollgate::key::ClientIp;
    ///
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert("203.0.113.7:5000".parse::<SocketAddr>().unwrap());
    /// request.headers_mut().insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
    /// // The peer is not a trusted proxy, so the spoofed header is ignored.
    /// assert_eq!(ClientIp::new().client_addr(&request), Ok(Some("203.0.113.7".parse().unwrap())));
    /// ```
    ///
    /// On tonic's server (with the `tonic` feature), the peer is the one tonic records:
    ///
    /// ```
    /// # #[cfg(feature = "tonic")] {
    /// use tollgate::key::ClientIp;
    /// use tonic::transport::server::TcpConnectInfo;
    ///
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert(TcpConnectInfo {
    ///     local_addr: Some("10.0.0.2:50051".parse().unwrap()),
    ///     remote_addr: Some("10.0.0.9:41000".parse().unwrap()),
    /// });
    /// request.headers_mut().insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
    /// let behind_lb = ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap();
    /// assert_eq!(behind_lb.client_addr(&request), Ok(Some("198.51.100.1".parse().unwrap())));
    /// # }
    /// ```
    pub fn client_addr<B>(&self, request: &Request<B>) -> Result<Option<IpAddr>, KeyRejection> {
        let Some(peer) = peer_addr(request) else {
            self.warn_no_peer();
            return Ok(None);
        };
        let peer = canonical(peer);
        if !self.trusted.contains(peer) {
            return Ok(Some(peer));
        }
        // Header lines are read last to first, entries right to left: the rightmost entries
        // were written by the proxies closest to us, the only ones we can vouch for. Each
        // entry is decoded only when it is reached, so whatever the client wrote left of
        // its own address (any bytes at all) is never read.
        for line in request.headers().get_all(&self.header).iter().rev() {
            for entry in line.as_bytes().rsplit(|byte| *byte == b',') {
                let hop = match self.grammar {
                    Grammar::AddressList => parse_node_bytes(entry.trim_ascii()),
                    Grammar::Forwarded => parse_forwarded_element(entry),
                };
                match hop {
                    Hop::Addr(addr) if self.trusted.contains(canonical(addr)) => continue,
                    Hop::Addr(addr) => return Ok(Some(canonical(addr))),
                    Hop::Empty => continue,
                    Hop::Unknown => return Ok(None),
                    Hop::Malformed => return Err(malformed(&self.header)),
                }
            }
        }
        Ok(None)
    }

    /// A server that does not hand the peer address to requests gives every request no
    /// key; say so once, with the fix, rather than per request.
    fn warn_no_peer(&self) {
        if !self.warned_no_peer.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "ClientIp found no peer address on a request, so no request keyed by client IP \
                 has a key until the server provides one: serve the axum router with \
                 `into_make_service_with_connect_info::<SocketAddr>()` (tollgate's `axum` \
                 feature reads `ConnectInfo<SocketAddr>`), on tonic's server enable tollgate's \
                 `tonic` feature (it reads tonic's `TcpConnectInfo`), or, in a plain hyper \
                 service, insert the connection's peer `SocketAddr` into the request extensions"
            );
        }
    }

    fn key_for(&self, addr: IpAddr) -> Caller {
        match addr {
            IpAddr::V4(v4) => Caller::new(v4.to_string()),
            IpAddr::V6(v6) if self.ipv6_prefix >= 128 => Caller::new(v6.to_string()),
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(u32::from(128 - self.ipv6_prefix))
                    .unwrap_or(0);
                let network = Ipv6Addr::from(u128::from(v6) & mask);
                Caller::new(format!("{network}/{}", self.ipv6_prefix))
            }
        }
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for ClientIp {
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        match self.client_addr(request) {
            Ok(addr) => addr.map(|addr| self.key_for(addr)).into(),
            Err(rejection) => Extracted::Rejected(rejection),
        }
    }
}

fn peer_addr<B>(request: &Request<B>) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(info) = request
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        && let Some(addr) = info.remote_addr()
    {
        return Some(addr.ip());
    }
    request.extensions().get::<SocketAddr>().map(SocketAddr::ip)
}

fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn malformed(name: &HeaderName) -> KeyRejection {
    KeyRejection::new(
        StatusCode::BAD_REQUEST,
        format!("the {name} header holds an entry that is not an IP address"),
    )
}

enum Hop {
    Addr(IpAddr),
    Empty,
    Unknown,
    Malformed,
}

/// An address as X-Forwarded-For or a Forwarded `for=` writes it: `1.2.3.4`, `1.2.3.4:80`,
/// `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:443`.
fn parse_node(node: &str) -> Hop {
    if node.is_empty() {
        return Hop::Empty;
    }
    if node.eq_ignore_ascii_case("unknown") || node.starts_with('_') {
        return Hop::Unknown;
    }
    if let Ok(addr) = IpAddr::from_str(node) {
        return Hop::Addr(addr);
    }
    if let Ok(addr) = SocketAddr::from_str(node) {
        return Hop::Addr(addr.ip());
    }
    if let Some(inner) = node
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        && let Ok(addr) = Ipv6Addr::from_str(inner)
    {
        return Hop::Addr(IpAddr::V6(addr));
    }
    Hop::Malformed
}

/// A node as raw header bytes: anything that is not UTF-8 is not an address.
fn parse_node_bytes(node: &[u8]) -> Hop {
    std::str::from_utf8(node).map_or(Hop::Malformed, parse_node)
}

/// The `for=` node of one RFC 7239 forwarded-element (`for=x;proto=https;by=y`). Only the
/// `for=` value is decoded: another parameter may hold any bytes (a quoted string may carry
/// obs-text) without making the element unreadable.
fn parse_forwarded_element(element: &[u8]) -> Hop {
    let node = element.split(|byte| *byte == b';').find_map(|pair| {
        let equals = pair.iter().position(|byte| *byte == b'=')?;
        let (name, value) = (&pair[..equals], &pair[equals + 1..]);
        name.trim_ascii()
            .eq_ignore_ascii_case(b"for")
            .then(|| value.trim_ascii())
    });
    match node {
        None if element.trim_ascii().is_empty() => Hop::Empty,
        None => Hop::Malformed,
        Some(value) => {
            let unquoted = value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(value);
            parse_node_bytes(unquoted)
        }
    }
}

/// Networks whose forwarding headers are believed.
#[derive(Clone, Debug, Default)]
struct TrustedProxies {
    networks: Arc<[Cidr]>,
}

impl TrustedProxies {
    fn parse<I, S>(blocks: I) -> Result<Self, BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let networks = blocks
            .into_iter()
            .map(|block| Cidr::parse(block.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            networks: networks.into(),
        })
    }

    fn contains(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        self.networks.iter().any(|network| network.contains(addr))
    }
}

#[derive(Clone, Copy, Debug)]
struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn parse(block: &str) -> Result<Self, BuildError> {
        let invalid = || BuildError::InvalidCidr {
            block: block.to_owned(),
        };
        let (addr, prefix) = match block.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (block.trim(), None),
        };
        let written = IpAddr::from_str(addr).map_err(|_| invalid())?;
        let max = if written.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(invalid)?,
        };
        // Addresses are compared in canonical form, IPv4-mapped IPv6 as IPv4, so a mapped
        // block such as ::ffff:10.0.0.0/104 becomes 10.0.0.0/8.
        match (written, canonical(written)) {
            (IpAddr::V6(_), IpAddr::V4(v4)) if prefix >= 96 => Ok(Self {
                network: IpAddr::V4(v4),
                prefix: prefix - 96,
            }),
            _ => Ok(Self {
                network: written,
                prefix,
            }),
        }
    }

    fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, addr) {
            (IpAddr::V4(net), IpAddr::V4(addr)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(addr) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(addr)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(addr) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_in_every_form() {
        for (node, want) in [
            ("1.2.3.4", "1.2.3.4"),
            ("1.2.3.4:80", "1.2.3.4"),
            ("2001:db8::1", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("[2001:db8::1]:443", "2001:db8::1"),
        ] {
            match parse_node(node) {
                Hop::Addr(addr) => assert_eq!(addr, want.parse::<IpAddr>().unwrap()),
                _ => panic!("{node} did not parse"),
            }
        }
        assert!(matches!(parse_node("unknown"), Hop::Unknown));
        assert!(matches!(parse_node("_hidden"), Hop::Unknown));
        assert!(matches!(parse_node("garbage"), Hop::Malformed));
    }

    #[test]
    fn forwarded_elements() {
        assert!(matches!(
            parse_forwarded_element(br#" for="[2001:db8:cafe::17]:4711";proto=https"#),
            Hop::Addr(IpAddr::V6(_))
        ));
        assert!(matches!(
            parse_forwarded_element(b"proto=http;For=192.0.2.60"),
            Hop::Addr(IpAddr::V4(_))
        ));
        assert!(matches!(
            parse_forwarded_element(b"by=1.2.3.4"),
            Hop::Malformed
        ));
    }

    #[test]
    fn zero_prefix_matches_its_family() {
        let any4 = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(any4.contains("8.8.8.8".parse().unwrap()));
        assert!(!any4.contains("::1".parse().unwrap()));
    }
}
