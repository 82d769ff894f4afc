//! A TLS front for the machine's PostgreSQL and Redis, with a certificate
//! authority made by the test: the servers the tests use speak plain TCP,
//! and a client's TLS is tested against this proxy, which ends TLS and
//! passes the bytes on.
//!
//! The certificates are made with the `openssl` command (on every Debian
//! machine): an authority, and a server certificate it signs for the names
//! given (`localhost`, say, so that a client connecting to `127.0.0.1` sees
//! a certificate for another name).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy speaks before TLS begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// PostgreSQL's: the client asks for TLS with an `SSLRequest` first.
    Postgres,
    /// TLS from the first byte (Redis's `rediss://`).
    Tls,
}

/// A certificate authority and a server certificate it signed, as files.
#[derive(Debug, Clone)]
pub struct Certificates {
    /// The authority's certificate: what a client trusts (`sslrootcert`).
    pub authority: PathBuf,
    pub server_chain: PathBuf,
    pub server_key: PathBuf,
}

impl Certificates {
    /// Makes an authority named `name` in `dir` and a server certificate
    /// for `hosts` (DNS names) that it signs.
    pub fn make(dir: &Path, name: &str, hosts: &[&str]) -> Certificates {
        let file = |suffix: &str| dir.join(format!("{name}-{suffix}"));
        let openssl = |args: &[&str]| {
            let output = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl runs");
            assert!(
                output.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let (ca, ca_key) = (file("ca.pem"), file("ca.key"));
        let subject = format!("/CN={name} test authority");
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
        args.extend(ec);
        args.extend(["-keyout", path(&ca_key), "-out", path(&ca)]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(&args);

        let (key, request, chain) = (file("server.key"), file("server.csr"), file("server.pem"));
        let mut args = vec!["req", "-subj", "/CN=flow test server"];
        args.extend(ec);
        args.extend(["-keyout", path(&key), "-out", path(&request)]);
        openssl(&args);
        let names: Vec<String> = hosts.iter().map(|host| format!("DNS:{host}")).collect();
        let extensions = file("server.ext");
        std::fs::write(
            &extensions,
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
                names.join(",")
            ),
        )
        .expect("write the extensions");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            path(&request),
            "-CA",
            path(&ca),
            "-CAkey",
            path(&ca_key),
            "-CAcreateserial",
            "-extfile",
            path(&extensions),
            "-out",
            path(&chain),
        ]);
        Certificates {
            authority: ca,
            server_chain: chain,
            server_key: key,
        }
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// The proxy: listening on a loopback port until the runtime ends.
#[derive(Debug)]
pub struct TlsProxy {
    pub port: u16,
}

impl TlsProxy {
    /// Serves TLS with `certificates` on a loopback port, passing what
    /// comes through on to `upstream`.
    pub async fn start(
        certificates: &Certificates,
        protocol: Protocol,
        upstream: SocketAddr,
    ) -> TlsProxy {
        let chain = CertificateDer::pem_file_iter(&certificates.server_chain)
            .expect("the server certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("the server certificate");
        let key = PrivateKeyDer::from_pem_file(&certificates.server_key).expect("the server key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("a server configuration");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("an address").port();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that gives up (a refused certificate) ends
                    // its connection; nothing to report.
                    let _ = pass_on(client, acceptor, protocol, upstream).await;
                });
            }
        });
        TlsProxy { port }
    }
}

/// PostgreSQL's `SSLRequest`: its length (8) and code.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

async fn pass_on(
    mut client: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    protocol: Protocol,
    upstream: SocketAddr,
) -> std::io::Result<()> {
    if protocol == Protocol::Postgres {
        let mut request = [0u8; 8];
        client.read_exact(&mut request).await?;
        if request != SSL_REQUEST {
            // A client without TLS: refused, as a server requiring it does.
            return Ok(());
        }
        client.write_all(b"S").await?;
    }
    let mut client = acceptor.accept(client).await?;
    let mut server = TcpStream::connect(upstream).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}
