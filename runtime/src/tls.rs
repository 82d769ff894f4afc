//! TLS to the services a deployment shares: PostgreSQL (`sslmode`) and Redis
//! (`rediss://`), over rustls with the aws-lc-rs provider the HTTP client
//! already builds.
//!
//! Both take libpq's words in their URL's query, so that one vocabulary
//! says how a connection is checked:
//!
//! * `sslmode=disable` (no TLS), `prefer` (TLS when the server offers it),
//!   `require` (TLS, the certificate not checked, unless `sslrootcert` is
//!   given, as libpq does), `verify-ca` (a certificate signed by a trusted
//!   authority), `verify-full` (that, and issued for the host connected to).
//!   A `rediss://` URL is `verify-full` unless it says otherwise.
//! * `sslrootcert=PATH`: the PEM file of the authorities to trust, for a
//!   server with a certificate of its own making; `system` (the default)
//!   trusts the machine's.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// How a TLS connection checks the server it reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl TlsMode {
    fn parse(word: &str) -> Result<TlsMode, String> {
        Ok(match word {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode `{other}`: the modes are disable, prefer, require, verify-ca and verify-full"
                ));
            }
        })
    }
}

/// The TLS settings a URL's query gives (`sslmode`, `sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: TlsMode,
    /// The authorities' PEM file; `None` for the machine's.
    pub root_cert: Option<PathBuf>,
}

impl TlsSettings {
    /// Takes `sslmode` and `sslrootcert` out of `parameters` (a URL's query,
    /// split at `&`), leaving the others; `default` is the mode when the
    /// query names none.
    pub fn take(parameters: &mut Vec<String>, default: TlsMode) -> Result<TlsSettings, String> {
        let mut settings = TlsSettings {
            mode: default,
            root_cert: None,
        };
        let mut error = None;
        parameters.retain(|parameter| {
            if let Some(word) = parameter.strip_prefix("sslmode=") {
                match TlsMode::parse(word) {
                    Ok(mode) => settings.mode = mode,
                    Err(message) => error = Some(message),
                }
                false
            } else if let Some(path) = parameter.strip_prefix("sslrootcert=") {
                settings.root_cert = (path != "system").then(|| PathBuf::from(path));
                false
            } else {
                true
            }
        });
        match error {
            Some(message) => Err(message),
            None => Ok(settings),
        }
    }

    /// Whether the server's certificate is checked against authorities.
    fn verifies(&self) -> bool {
        match self.mode {
            TlsMode::VerifyCa | TlsMode::VerifyFull => true,
            // libpq: a root certificate given makes `require` check the chain.
            TlsMode::Require | TlsMode::Prefer => self.root_cert.is_some(),
            TlsMode::Disable => false,
        }
    }

    /// The authorities trusted: the PEM file's, or the machine's.
    pub fn roots(&self) -> Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(path) => {
                let certificates = CertificateDer::pem_file_iter(path)
                    .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                    .map_err(|e| format!("sslrootcert `{}`: {e}", path.display()))?;
                if certificates.is_empty() {
                    return Err(format!(
                        "sslrootcert `{}` holds no certificate",
                        path.display()
                    ));
                }
                for certificate in certificates {
                    roots
                        .add(certificate)
                        .map_err(|e| format!("sslrootcert `{}`: {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(
                        "the machine trusts no certificate authority; name one with sslrootcert=PATH"
                            .to_string(),
                    );
                }
            }
        }
        Ok(roots)
    }

    /// The rustls client configuration these settings call for.
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let verifier: Arc<dyn ServerCertVerifier> = if self.verifies() {
            let chain = WebPkiServerVerifier::builder_with_provider(
                Arc::new(self.roots()?),
                Arc::clone(&provider),
            )
            .build()
            .map_err(|e| format!("TLS: {e}"))?;
            if self.mode == TlsMode::VerifyFull {
                chain
            } else {
                Arc::new(AnyName { chain })
            }
        } else {
            Arc::new(Unchecked { provider })
        };
        Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth())
    }
}

/// `verify-ca`: the chain is checked, not the name it was issued for.
#[derive(Debug)]
struct AnyName {
    chain: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        match self.chain.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                NotValidForName | NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// `require` (and `prefer`) without a root certificate: encrypted, the
/// certificate taken as it comes, as libpq does. The handshake's signatures
/// are still checked, so the session is with the holder of that certificate.
#[derive(Debug)]
struct Unchecked {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// tokio-postgres's TLS over rustls.
#[cfg(feature = "postgres")]
pub mod postgres {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

    /// Makes a TLS connector per connection, for its host.
    #[derive(Clone)]
    pub struct MakeRustls {
        config: Arc<rustls::ClientConfig>,
    }

    impl MakeRustls {
        pub fn new(config: rustls::ClientConfig) -> MakeRustls {
            MakeRustls {
                config: Arc::new(config),
            }
        }
    }

    impl<S> MakeTlsConnect<S> for MakeRustls
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = RustlsStream<S>;
        type TlsConnect = RustlsConnect;
        type Error = rustls::pki_types::InvalidDnsNameError;

        fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, Self::Error> {
            Ok(RustlsConnect {
                name: ServerName::try_from(host.to_string())?,
                connector: tokio_rustls::TlsConnector::from(Arc::clone(&self.config)),
            })
        }
    }

    /// The TLS handshake of one connection.
    pub struct RustlsConnect {
        name: ServerName<'static>,
        connector: tokio_rustls::TlsConnector,
    }

    impl<S> TlsConnect<S> for RustlsConnect
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = RustlsStream<S>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

        fn connect(self, stream: S) -> Self::Future {
            Box::pin(async move {
                let stream = self.connector.connect(self.name, stream).await?;
                Ok(RustlsStream(stream))
            })
        }
    }

    /// A connection to PostgreSQL inside TLS.
    pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

    impl<S> tokio_postgres::tls::TlsStream for RustlsStream<S>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        /// None: SCRAM's channel binding needs the certificate's own hash
        /// algorithm, and a wrong one would fail the login; without it the
        /// password exchange is still inside TLS.
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }
}
