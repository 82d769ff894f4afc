//! An SMTP server on loopback that keeps every message it is given, for the
//! tests of flowd's emails. It speaks enough of RFC 5321 for a real client
//! (lettre): greeting, EHLO/HELO, MAIL, RCPT, DATA with dot-stuffing, RSET,
//! NOOP, QUIT. It can refuse the first messages with a transient error, to
//! test the sender's retries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A message as delivered.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    /// Header lines, unfolded, as `(name, value)`.
    pub headers: Vec<(String, String)>,
    /// The body, decoded from quoted-printable if it was.
    pub body: String,
}

impl Mail {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct SmtpSink {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    /// Starts the sink on the current tokio runtime.
    pub async fn start() -> SmtpSink {
        SmtpSink::refusing(0).await
    }

    /// A sink that answers the first `refusals` MAIL commands with
    /// `451` (try again later).
    pub async fn refusing(refusals: usize) -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("an address").port();
        let mails = Arc::new(Mutex::new(Vec::new()));
        let refusals = Arc::new(AtomicUsize::new(refusals));
        let kept = Arc::clone(&mails);
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(session(socket, Arc::clone(&kept), Arc::clone(&refusals)));
            }
        });
        SmtpSink { port, mails }
    }

    /// Every message delivered so far.
    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits up to ten seconds until at least `count` messages arrived.
    pub async fn wait_for(&self, count: usize) -> Vec<Mail> {
        for _ in 0..1_000 {
            let mails = self.mails();
            if mails.len() >= count {
                return mails;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!(
            "expected {count} email(s), the sink got {}",
            self.mails().len()
        );
    }
}

async fn session(
    socket: tokio::net::TcpStream,
    mails: Arc<Mutex<Vec<Mail>>>,
    refusals: Arc<AtomicUsize>,
) {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read);
    if write.write_all(b"220 sink ESMTP\r\n").await.is_err() {
        return;
    }
    let (mut from, mut to) = (String::new(), Vec::new());
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let command = line.trim_end().to_string();
        let upper = command.to_ascii_uppercase();
        let answer: &str = if upper.starts_with("EHLO") {
            "250-sink\r\n250-8BITMIME\r\n250 SMTPUTF8\r\n"
        } else if upper.starts_with("HELO") {
            "250 sink\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            let refused = refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if refused {
                "451 4.3.0 try again later\r\n"
            } else {
                from = address(&command["MAIL FROM:".len()..]);
                to.clear();
                "250 ok\r\n"
            }
        } else if upper.starts_with("RCPT TO:") {
            to.push(address(&command["RCPT TO:".len()..]));
            "250 ok\r\n"
        } else if upper == "DATA" {
            if write.write_all(b"354 go ahead\r\n").await.is_err() {
                return;
            }
            let mut data = Vec::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                if line == ".\r\n" || line == ".\n" {
                    break;
                }
                // Dot-stuffing: a line that began with a dot got another.
                let text = line.strip_prefix('.').unwrap_or(&line);
                data.push(text.to_string());
            }
            let mail = parse(&from, &to, &data.concat());
            mails.lock().unwrap_or_else(|p| p.into_inner()).push(mail);
            "250 queued\r\n"
        } else if upper == "RSET" || upper == "NOOP" {
            "250 ok\r\n"
        } else if upper == "QUIT" {
            let _ = write.write_all(b"221 bye\r\n").await;
            return;
        } else {
            "502 not implemented\r\n"
        };
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// `<a@b>` (and any parameters after it) to `a@b`.
fn address(text: &str) -> String {
    let text = text.trim();
    let end = text.find('>').map_or(text.len(), |i| i + 1);
    text[..end]
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_string()
}

fn parse(from: &str, to: &[String], data: &str) -> Mail {
    let (head, body) = data
        .split_once("\r\n\r\n")
        .or_else(|| data.split_once("\n\n"))
        .unwrap_or((data, ""));
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in head.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = headers.last_mut() {
                value.push_str(line.trim_start());
            }
        } else if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let quoted = headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case("content-transfer-encoding")
            && value.eq_ignore_ascii_case("quoted-printable")
    });
    let body = if quoted {
        quoted_printable(body)
    } else {
        body.replace("\r\n", "\n")
    };
    Mail {
        from: from.to_string(),
        to: to.to_vec(),
        headers,
        body,
    }
}

/// Decodes a quoted-printable body (RFC 2045 §6.7): soft line breaks and
/// `=XX` escapes.
fn quoted_printable(text: &str) -> String {
    let joined = text.replace("=\r\n", "").replace("\r\n", "\n");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'=')
            .then(|| joined.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
