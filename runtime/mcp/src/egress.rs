//! Where a browser may connect: a SOCKS5 proxy that refuses private
//! addresses.
//!
//! A browser step navigates wherever its arguments say, and those come from
//! a tenant's workflow and its run's input. Left alone, the browser reaches
//! everything its host reaches: cloud metadata at 169.254.169.254, the
//! database's port on loopback, services on the private network. Playwright's
//! own origin lists do not help against that (its documentation says they are
//! no security boundary: they do not apply to redirects, and a host name that
//! resolves to 127.0.0.1 is not "127.0.0.1").
//!
//! So the pool starts each browser server with this proxy in front of its
//! browser (`--proxy-server socks5://127.0.0.1:PORT`; Playwright sends
//! loopback through the proxy too). Every connection the browser makes, http,
//! https and websockets alike, and redirects included, arrives here as a
//! SOCKS5 CONNECT with the host name. The proxy resolves the name itself,
//! refuses it if any address it resolves to is not public (unless the
//! operator allowed that host), and connects to the address it checked, so a
//! name that resolves differently the second time (DNS rebinding) cannot
//! slip through. A refusal is the SOCKS reply "not allowed by ruleset", which
//! Chromium reports as a failed navigation, and the proxy keeps a note of it
//! so that the step's error can say what was refused and why.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// What a browser may reach beyond the public internet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EgressPolicy {
    /// Hosts (and ports) the operator allowed although they resolve to a
    /// private address: from the origins it allows (`http://127.0.0.1:8080`,
    /// `https://intranet.acme.io:*`).
    pub allowed: Vec<AllowedHost>,
    /// Whether every private, loopback and link-local address is allowed
    /// (the operator's opt-out of the whole rule).
    pub allow_private: bool,
}

/// A host the operator allows, on one port or all.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AllowedHost {
    /// Lower case; an IPv6 address without its brackets.
    pub host: String,
    /// `None` for any port (`:*` in the origin).
    pub port: Option<u16>,
}

impl AllowedHost {
    /// The host and port of an origin as Playwright's `--allowed-origins`
    /// takes them (`scheme://host[:port|:*]`); the scheme's port when none
    /// is written. `None` when it is not such an origin.
    pub fn of_origin(origin: &str) -> Option<AllowedHost> {
        let (scheme, rest) = origin.split_once("://")?;
        let default_port = match scheme.to_ascii_lowercase().as_str() {
            "http" | "ws" => 80,
            "https" | "wss" => 443,
            _ => return None,
        };
        if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
            return None;
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':'))
        } else {
            match rest.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        let port = match port {
            None => Some(default_port),
            Some("*") => None,
            Some(port) => Some(port.parse().ok()?),
        };
        if host.is_empty() {
            return None;
        }
        Some(AllowedHost {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.is_none_or(|p| p == port)
    }
}

/// Why an address is not public, for messages; `None` for a public one.
pub fn non_public(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = address.octets();
    Some(match (a, b, c) {
        (127, _, _) => "a loopback address",
        (169, 254, _) => "a link-local address (cloud metadata lives there)",
        (10, _, _) | (192, 168, _) => "a private address",
        (172, b, _) if (16..32).contains(&b) => "a private address",
        (100, b, _) if (64..128).contains(&b) => "a shared (carrier-grade NAT) address",
        (0, _, _) => "an unspecified address (it reaches this host)",
        (192, 0, 0) | (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a reserved address",
        (198, b, _) if b == 18 || b == 19 => "a benchmarking address",
        (a, _, _) if a >= 224 => "a multicast or reserved address",
        _ => return None,
    })
}

fn non_public_v6(address: Ipv6Addr) -> Option<&'static str> {
    if address.is_loopback() {
        return Some("a loopback address");
    }
    if address.is_unspecified() {
        return Some("an unspecified address (it reaches this host)");
    }
    // Addresses that carry an IPv4 address are judged by it: mapped
    // (::ffff:a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
    if let Some(v4) = address.to_ipv4_mapped() {
        return non_public_v4(v4);
    }
    let segments = address.segments();
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., hi, lo] = segments;
        return non_public_v4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    }
    if segments[0] == 0x2002 {
        return non_public_v4(Ipv4Addr::from(
            (u32::from(segments[1]) << 16) | u32::from(segments[2]),
        ));
    }
    Some(match segments[0] {
        s if s & 0xfe00 == 0xfc00 => "a private (unique local) address",
        s if s & 0xffc0 == 0xfe80 => "a link-local address",
        s if s & 0xff00 == 0xff00 => "a multicast address",
        0x2001 if segments[1] == 0x0db8 => "a reserved address",
        // The rest of ::/8 (IPv4-compatible and other deprecated forms).
        0 => "a reserved address",
        _ => return None,
    })
}

/// A connection the proxy refused: the host the browser asked for, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub host: String,
    pub port: u16,
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} ({})", self.host, self.port, self.reason)
    }
}

/// How many refusals a proxy keeps for messages.
const KEPT_REFUSALS: usize = 8;
/// How long the browser has to say where it wants to go.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long resolving and connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct EgressProxy {
    address: SocketAddr,
    refusals: Arc<Mutex<Vec<Refusal>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EgressProxy {
    /// Listens on a free loopback port and serves `policy` there.
    pub async fn start(policy: EgressPolicy) -> std::io::Result<EgressProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let address = listener.local_addr()?;
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let policy = Arc::new(policy);
        let task = tokio::spawn({
            let refusals = Arc::clone(&refusals);
            async move {
                let mut clients = tokio::task::JoinSet::new();
                loop {
                    // Finished clients leave their results until collected.
                    while clients.try_join_next().is_some() {}
                    let Ok((client, _)) = listener.accept().await else {
                        // Out of descriptors, say: not a reason to spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let (policy, refusals) = (Arc::clone(&policy), Arc::clone(&refusals));
                    // Dropping the set with this task closes every tunnel.
                    clients.spawn(async move {
                        let _ = serve(client, &policy, &refusals).await;
                    });
                }
            }
        });
        Ok(EgressProxy {
            address,
            refusals,
            task,
        })
    }

    /// The `--proxy-server` value for the browser.
    pub fn url(&self) -> String {
        format!("socks5://{}", self.address)
    }

    /// The refusals since the last call, oldest first.
    pub fn take_refusals(&self) -> Vec<Refusal> {
        std::mem::take(&mut *self.refusals.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// SOCKS5 reply codes (RFC 1928).
const SUCCEEDED: u8 = 0;
const GENERAL_FAILURE: u8 = 1;
const NOT_ALLOWED: u8 = 2;
const HOST_UNREACHABLE: u8 = 4;
const COMMAND_NOT_SUPPORTED: u8 = 7;
const ADDRESS_NOT_SUPPORTED: u8 = 8;

/// One client: the SOCKS5 handshake (no authentication, CONNECT only), the
/// policy's decision, then the tunnel.
async fn serve(
    mut client: TcpStream,
    policy: &EgressPolicy,
    refusals: &Mutex<Vec<Refusal>>,
) -> std::io::Result<()> {
    let Ok(request) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut client)).await else {
        return Ok(());
    };
    let (host, port) = match request? {
        Ok(target) => target,
        Err(code) => return reply(&mut client, code).await,
    };
    let decided = tokio::time::timeout(CONNECT_TIMEOUT, decide(policy, &host, port)).await;
    let addresses = match decided {
        Ok(Ok(addresses)) => addresses,
        Ok(Err(Denied::Unresolved)) | Err(_) => return reply(&mut client, HOST_UNREACHABLE).await,
        Ok(Err(Denied::Refused(reason))) => {
            {
                let mut kept = refusals.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() == KEPT_REFUSALS {
                    kept.remove(0);
                }
                kept.push(Refusal { host, port, reason });
            }
            return reply(&mut client, NOT_ALLOWED).await;
        }
    };
    let mut upstream = None;
    for address in addresses {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await
        {
            upstream = Some(stream);
            break;
        }
    }
    let Some(mut upstream) = upstream else {
        return reply(&mut client, HOST_UNREACHABLE).await;
    };
    reply(&mut client, SUCCEEDED).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Reads the greeting and the request; the target, or the reply code that
/// refuses the request.
async fn handshake(client: &mut TcpStream) -> std::io::Result<Result<(String, u16), u8>> {
    let mut head = [0u8; 2];
    client.read_exact(&mut head).await?;
    if head[0] != 5 {
        return Err(std::io::Error::other("not SOCKS5"));
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    client.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        // No acceptable method: only "no authentication" is offered here.
        client.write_all(&[5, 0xff]).await?;
        return Err(std::io::Error::other("no acceptable SOCKS method"));
    }
    client.write_all(&[5, 0]).await?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await?;
    let [version, command, _, address_type] = request;
    if version != 5 {
        return Err(std::io::Error::other("not SOCKS5"));
    }
    let host = match address_type {
        1 => {
            let mut octets = [0u8; 4];
            client.read_exact(&mut octets).await?;
            Ipv4Addr::from(octets).to_string()
        }
        3 => {
            let mut length = [0u8; 1];
            client.read_exact(&mut length).await?;
            let mut name = vec![0u8; usize::from(length[0])];
            client.read_exact(&mut name).await?;
            match String::from_utf8(name) {
                Ok(name) => name.to_ascii_lowercase(),
                Err(_) => return Ok(Err(ADDRESS_NOT_SUPPORTED)),
            }
        }
        4 => {
            let mut octets = [0u8; 16];
            client.read_exact(&mut octets).await?;
            Ipv6Addr::from(octets).to_string()
        }
        _ => return Ok(Err(ADDRESS_NOT_SUPPORTED)),
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await?;
    if command != 1 {
        // BIND and UDP ASSOCIATE would open other doors.
        return Ok(Err(COMMAND_NOT_SUPPORTED));
    }
    Ok(Ok((host, u16::from_be_bytes(port))))
}

/// Why a target gets no connection.
#[derive(Debug, PartialEq, Eq)]
enum Denied {
    /// The policy refuses it: the step's error says so.
    Refused(String),
    /// Its name resolves to nothing: the browser sees an unreachable host,
    /// as it would without a proxy. Not a refusal of the policy's, and not
    /// told in the step's error, which would otherwise list the names
    /// Chromium looks up on its own (`accounts.google.com`) where the
    /// host's resolver knows none.
    Unresolved,
}

/// The addresses to connect to, all checked, or why the target gets none.
async fn decide(policy: &EgressPolicy, host: &str, port: u16) -> Result<Vec<SocketAddr>, Denied> {
    let host = host.trim_end_matches('.');
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| Denied::Unresolved)?
            .collect(),
    };
    if addresses.is_empty() {
        return Err(Denied::Unresolved);
    }
    let allowed = policy.allow_private || policy.allowed.iter().any(|a| a.matches(host, port));
    if !allowed {
        // Every address, not only the one connected to: a name that mixes
        // public and private addresses is refused as a whole.
        for address in &addresses {
            if let Some(why) = non_public(address.ip()) {
                return Err(Denied::Refused(if host == address.ip().to_string() {
                    why.to_string()
                } else {
                    format!("it resolves to {}, {why}", address.ip())
                }));
            }
        }
    }
    Ok(addresses)
}

async fn reply(client: &mut TcpStream, code: u8) -> std::io::Result<()> {
    // The bound address is not used by browsers: zeros.
    let code = if code > ADDRESS_NOT_SUPPORTED {
        GENERAL_FAILURE
    } else {
        code
    };
    client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_a_tenant_must_not_reach_are_not_public() {
        for address in [
            "127.0.0.1",
            "127.8.9.10",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:0001::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "::127.0.0.1",
        ] {
            let ip: IpAddr = address.parse().unwrap();
            assert!(non_public(ip).is_some(), "{address} counted as public");
        }
        for address in ["93.184.216.34", "1.1.1.1", "172.32.0.1", "2606:4700::1111"] {
            let ip: IpAddr = address.parse().unwrap();
            assert_eq!(non_public(ip), None, "{address}");
        }
    }

    #[test]
    fn origins_give_the_hosts_they_allow() {
        let cases = [
            ("http://127.0.0.1:8080", Some(("127.0.0.1", Some(8080)))),
            ("http://localhost:*", Some(("localhost", None))),
            (
                "https://Intranet.Acme.io",
                Some(("intranet.acme.io", Some(443))),
            ),
            ("http://[::1]:9000", Some(("::1", Some(9000)))),
            ("http://example.com", Some(("example.com", Some(80)))),
            ("ftp://example.com", None),
            ("http://example.com/path", None),
            ("http://user@example.com", None),
            ("example.com", None),
            ("http://:80", None),
        ];
        for (origin, expected) in cases {
            let found = AllowedHost::of_origin(origin);
            let expected = expected.map(|(host, port)| AllowedHost {
                host: host.to_string(),
                port,
            });
            assert_eq!(found, expected, "{origin}");
        }
    }

    /// A SOCKS5 CONNECT by name, as Chromium sends it; the reply code.
    async fn connect_through(proxy: &EgressProxy, host: &str, port: u16) -> u8 {
        let mut stream = TcpStream::connect(proxy.address).await.unwrap();
        stream.write_all(&[5, 1, 0]).await.unwrap();
        let mut choice = [0u8; 2];
        stream.read_exact(&mut choice).await.unwrap();
        assert_eq!(choice, [5, 0]);
        let mut request = vec![5, 1, 0, 3, host.len() as u8];
        request.extend_from_slice(host.as_bytes());
        request.extend_from_slice(&port.to_be_bytes());
        stream.write_all(&request).await.unwrap();
        let mut answer = [0u8; 10];
        stream.read_exact(&mut answer).await.unwrap();
        answer[1]
    }

    #[tokio::test]
    async fn the_proxy_refuses_loopback_by_name_unless_the_operator_allows_it() {
        let target = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = target.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let _ = target.accept().await;
            }
        });

        let strict = EgressProxy::start(EgressPolicy::default()).await.unwrap();
        // By name, as a page would ask: `localhost` resolves to loopback.
        assert_eq!(
            connect_through(&strict, "localhost", port).await,
            NOT_ALLOWED
        );
        assert_eq!(
            connect_through(&strict, "127.0.0.1", port).await,
            NOT_ALLOWED
        );
        let refused = strict.take_refusals();
        assert_eq!(refused.len(), 2);
        assert!(refused[0].reason.contains("loopback"), "{refused:?}");
        assert!(strict.take_refusals().is_empty());

        let allowing = EgressProxy::start(EgressPolicy {
            allowed: vec![AllowedHost::of_origin(&format!("http://127.0.0.1:{port}")).unwrap()],
            allow_private: false,
        })
        .await
        .unwrap();
        assert_eq!(
            connect_through(&allowing, "127.0.0.1", port).await,
            SUCCEEDED
        );
        // Only that port.
        assert_eq!(
            connect_through(&allowing, "127.0.0.1", port.wrapping_add(1)).await,
            NOT_ALLOWED
        );
    }

    /// A name nobody resolves is an unreachable host, not a refusal of the
    /// policy's: the step's error lists only what the policy refused, not
    /// each name Chromium looked up on its own where the resolver knows none.
    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_unreachable_not_refused() {
        let strict = EgressProxy::start(EgressPolicy::default()).await.unwrap();
        // `.invalid` never resolves (RFC 6761).
        assert_eq!(
            connect_through(&strict, "accounts.flow-test.invalid", 443).await,
            HOST_UNREACHABLE
        );
        assert!(strict.take_refusals().is_empty());
    }
}
