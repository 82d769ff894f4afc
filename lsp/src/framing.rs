//! The messages between the client and tower-lsp-server, framed and screened.
//!
//! tower-lsp-server's transport answers the first malformed message and then
//! stops reading (its framed reader ends after an error), so the server
//! exited with status 0 on a stray byte; its header parser also wants
//! `Content-Length` spelt with that case and a `Content-Type` with a
//! charset. So the server reads its input through this screen instead: each
//! framed message is read here (header names in any case), and only one that
//! tower-lsp-server accepts is passed on, framed again; the others are
//! answered with a JSON-RPC error, as is a request whose method starts with
//! `$/`, to which tower-lsp-server gives no answer. The answers and the
//! server's own messages go out through one writer, a whole frame at a time,
//! so that they never interleave. The screen also notes whether `shutdown`
//! came before `exit`, which decides the exit status.

use std::future::Future;
use std::process::ExitCode;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, DuplexStream};
use tokio::sync::mpsc;
use tower_lsp_server::jsonrpc::{Error, Id, Request, Response};

/// How much of a message may be in flight between the screen and the
/// server, each way: the size of a read from standard input.
const PIPE_BYTES: usize = 64 * 1024;

/// Headers longer than this are not headers: real ones are a few dozen bytes.
const MOST_HEADER_BYTES: usize = 1024;

const CONTENT_LENGTH: &[u8] = b"content-length";

/// A message as tower-lsp-server reads one (its own type is private): what
/// deserializes as this passes its decoder, so the screen never hands it a
/// message that would end its transport.
#[derive(Deserialize)]
#[serde(untagged)]
enum Message {
    #[allow(dead_code)] // reason: the screen only asks whether a response deserializes
    Response(Response),
    Request(Request),
}

/// Runs `server` behind the screen: it reads its messages from the first
/// stream it is given and writes its own to the second, while `input` and
/// `output` are the client's. Ends when the server ends (after `exit`, or
/// the end of `input`), once what it wrote is out, with the status the
/// process should exit with.
pub(crate) async fn screened<S, F>(
    input: impl AsyncRead + Unpin,
    output: impl AsyncWrite + Unpin,
    server: S,
) -> ExitCode
where
    S: FnOnce(DuplexStream, DuplexStream) -> F,
    F: Future<Output = ()>,
{
    let mut session = Session::default();
    let (to_server, server_input) = tokio::io::duplex(PIPE_BYTES);
    let (server_output, from_server) = tokio::io::duplex(PIPE_BYTES);
    let (answers, answered) = mpsc::channel(16);
    let server = server(server_input, server_output);
    let reading = screen(input, to_server, answers, &mut session);
    let serving = async {
        tokio::pin!(server);
        tokio::select! {
            // After `exit` the client's input is no longer read.
            () = &mut server => {}
            // The input ended (and the screen's end of the pipe with it):
            // the server answers what it was given, then ends too.
            () = reading => server.await,
        }
    };
    // The writer ends when the server's output does, which is when the
    // server ends.
    tokio::join!(serving, write_out(from_server, answered, output));
    session.exit_code()
}

/// What the client asked of the end of the session. tower-lsp-server ends
/// on `exit` without telling whether `shutdown` came first, which decides
/// the exit status.
#[derive(Default)]
struct Session {
    shutdown: bool,
    exit: bool,
}

impl Session {
    fn note(&mut self, message: &Message) {
        if let Message::Request(request) = message {
            match request.method() {
                "shutdown" if request.id().is_some() => self.shutdown = true,
                "exit" => self.exit = true,
                _ => {}
            }
        }
    }

    /// Failure after an `exit` that no `shutdown` preceded, as the protocol
    /// asks; success after one that did, and when the input just ended.
    fn exit_code(&self) -> ExitCode {
        if self.exit && !self.shutdown {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// Reads the client's messages from `input`: passes on to `server` those
/// it accepts, and sends an error response to `answers` for the others.
async fn screen(
    input: impl AsyncRead + Unpin,
    mut server: DuplexStream,
    answers: mpsc::Sender<Vec<u8>>,
    session: &mut Session,
) {
    let mut frames = Frames::new(input);
    while let Some(frame) = frames.next().await {
        let judged = match frame {
            Frame::Body(body) => judge(body),
            Frame::Malformed => Err(Response::from_error(Id::Null, Error::parse_error())),
        };
        let sent = match judged {
            Ok((message, body)) => {
                session.note(&message);
                write_frame(&mut server, &body).await.is_ok()
            }
            Err(answer) => {
                // A response of tower-lsp-server's own types always serializes.
                let Ok(answer) = serde_json::to_vec(&answer) else {
                    continue;
                };
                answers.send(answer).await.is_ok()
            }
        };
        if !sent {
            return;
        }
    }
}

/// The message `body`, and the body to pass on, when it may go to the
/// server; if not, the error response that answers it: a parse error
/// (-32700) for what is not JSON, an invalid request (-32600, with its id
/// when it has one) for JSON that is not a JSON-RPC 2.0 message (one with
/// no method, no result and no error among them), and method not found
/// (-32601) for a request whose method starts with `$/`, which
/// tower-lsp-server leaves unanswered (it drops every answer "method not
/// found" to a `$/` method, which is right for a notification only).
fn judge(body: Vec<u8>) -> Result<(Message, Vec<u8>), Response> {
    let parse_error = || Response::from_error(Id::Null, Error::parse_error());
    let text = String::from_utf8(body).map_err(|_| parse_error())?;
    let text = without_lone_surrogates(text);
    match serde_json::from_str::<Message>(&text) {
        Ok(Message::Request(request)) if request.method().starts_with("$/") => match request.id() {
            // The protocol's `$/` notifications may be ignored.
            None => Ok((Message::Request(request), text.into_bytes())),
            Some(id) => Err(Response::from_error(
                id.clone(),
                Error {
                    data: Some(request.method().into()),
                    ..Error::method_not_found()
                },
            )),
        },
        // tower-lsp-server reads a missing method as "" (regression, an
        // audit: `{"jsonrpc": "2.0", "id": 77}` was "method not found");
        // a method written `""` is a method nobody serves.
        Ok(Message::Request(request)) if request.method().is_empty() && !names_a_method(&text) => {
            Err(Response::from_error(
                request.id().cloned().unwrap_or(Id::Null),
                Error::invalid_request(),
            ))
        }
        Ok(message) => Ok((message, text.into_bytes())),
        Err(error) if error.is_data() => {
            Err(Response::from_error(id_of(&text), Error::invalid_request()))
        }
        Err(_) => Err(parse_error()),
    }
}

/// `text` with each `\uXXXX` escape of a lone UTF-16 surrogate written
/// `\ufffd`, one code unit for one, so that the positions after it stay
/// where the client counts them. JSON allows such escapes and JavaScript's
/// `JSON.stringify` writes them for a string cut inside a pair, but serde
/// refuses them: the whole edit was dropped as a parse error, and the
/// server's copy of the document drifted from the editor's (an audit).
fn without_lone_surrogates(text: String) -> String {
    let surrogate = |at: usize| -> Option<u16> {
        let hex = text.get(at + 2..at + 6)?;
        let unit = u16::from_str_radix(hex, 16).ok()?;
        (text.as_bytes()[at + 1] == b'u' && (0xD800..=0xDFFF).contains(&unit)).then_some(unit)
    };
    let bytes = text.as_bytes();
    let mut lone = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        match surrogate(at) {
            // A high surrogate with its low one: a character.
            Some(0xD800..=0xDBFF)
                if bytes.get(at + 6) == Some(&b'\\')
                    && matches!(surrogate(at + 6), Some(0xDC00..=0xDFFF)) =>
            {
                at += 12;
            }
            Some(_) => {
                lone.push(at);
                at += 6;
            }
            // Any other escape is two characters or more, none a backslash
            // that starts another.
            None => at += 2,
        }
    }
    if lone.is_empty() {
        return text;
    }
    let mut mended = text.into_bytes();
    for at in lone {
        mended[at + 2..at + 6].copy_from_slice(b"fffd");
    }
    String::from_utf8(mended).expect("hex digits replaced by hex digits")
}

/// Whether the message `text` has a `method` member: serde reads one
/// that is missing as `""`, as if it were written so.
fn names_a_method(text: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
        .is_ok_and(|message| message.contains_key("method"))
}

/// The id of the message `text`, when it is JSON with an id that JSON-RPC
/// allows; else null, as JSON-RPC answers a request whose id is unknown.
fn id_of(text: &str) -> Id {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|message| Id::deserialize(message.get("id")?).ok())
        .unwrap_or(Id::Null)
}

/// Writes the server's messages and the screen's answers to `output`, a
/// whole frame at a time, until the server's output ends.
async fn write_out(
    from_server: DuplexStream,
    mut answers: mpsc::Receiver<Vec<u8>>,
    mut output: impl AsyncWrite + Unpin,
) {
    let mut server = Frames::new(from_server);
    loop {
        // Both branches are cancel safe: `Frames::next` keeps what it read
        // in its buffer, and `recv` loses nothing.
        let body = tokio::select! {
            frame = server.next() => match frame {
                Some(Frame::Body(body)) => body,
                // tower-lsp-server frames every message it writes.
                Some(Frame::Malformed) => continue,
                None => return,
            },
            Some(answer) = answers.recv() => answer,
        };
        if write_frame(&mut output, &body).await.is_err() {
            return;
        }
    }
}

async fn write_frame(output: &mut (impl AsyncWrite + Unpin), body: &[u8]) -> std::io::Result<()> {
    let mut frame = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    frame.extend_from_slice(body);
    output.write_all(&frame).await?;
    output.flush().await
}

/// What a stream of framed messages yields.
#[derive(Debug, PartialEq)]
enum Frame {
    /// A message's body, as long as its `Content-Length` said.
    Body(Vec<u8>),
    /// Headers without a length that can be read, or bytes that are not
    /// headers. What follows, up to the next `Content-Length`, is skipped.
    Malformed,
}

/// Framed messages read from a stream: headers (`Name: value` lines, the
/// name in any case), a blank line, then as many bytes of body as the
/// `Content-Length` header says.
struct Frames<R> {
    reader: R,
    buffer: Vec<u8>,
    /// After malformed headers, the bytes up to the next `Content-Length`
    /// are skipped: they are most likely the body those headers did not
    /// measure, which nothing tells from a message that follows.
    skipping: bool,
}

impl<R: AsyncRead + Unpin> Frames<R> {
    fn new(reader: R) -> Frames<R> {
        Frames {
            reader,
            buffer: Vec::new(),
            skipping: false,
        }
    }

    /// The next frame; nothing once the stream ends or fails. Cancel safe:
    /// what was read stays in the buffer.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.take() {
                return Some(frame);
            }
            self.buffer.reserve(PIPE_BYTES);
            match self.reader.read_buf(&mut self.buffer).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The first frame of the buffer, taken out of it, when it is whole.
    fn take(&mut self) -> Option<Frame> {
        if self.skipping {
            let Some(start) = find(&self.buffer, CONTENT_LENGTH) else {
                // Keep what may be the start of the name, cut by a read.
                let cut = self.buffer.len().saturating_sub(CONTENT_LENGTH.len() - 1);
                self.buffer.drain(..cut);
                return None;
            };
            self.buffer.drain(..start);
            self.skipping = false;
        }
        let searched = &self.buffer[..self.buffer.len().min(MOST_HEADER_BYTES)];
        let Some(end) = find(searched, b"\r\n\r\n") else {
            if self.buffer.len() < MOST_HEADER_BYTES {
                return None;
            }
            return Some(self.malformed(0));
        };
        let start = end + 4;
        let Some(length) = content_length(&self.buffer[..end]) else {
            return Some(self.malformed(start));
        };
        let whole = start.checked_add(length)?;
        if self.buffer.len() < whole {
            return None;
        }
        let body = self.buffer[start..whole].to_vec();
        self.buffer.drain(..whole);
        Some(Frame::Body(body))
    }

    /// Drops the first `headers` bytes of the buffer, and what follows them
    /// up to the next `Content-Length`.
    fn malformed(&mut self, headers: usize) -> Frame {
        self.buffer.drain(..headers);
        // The search must not find the name in the bytes just refused.
        if headers == 0 && !self.buffer.is_empty() {
            self.buffer.remove(0);
        }
        self.skipping = true;
        Frame::Malformed
    }
}

/// The `Content-Length` of `headers`, the bytes before the blank line;
/// nothing unless every line is a header and the length is a number.
fn content_length(headers: &[u8]) -> Option<usize> {
    let headers = std::str::from_utf8(headers).ok()?;
    let mut length = None;
    for line in headers.split("\r\n") {
        let (name, value) = line.split_once(':')?;
        if name.trim().eq_ignore_ascii_case("content-length") {
            length = Some(value.trim().parse().ok()?);
        }
    }
    length
}

/// Where `needle` first is in `haystack`, ASCII letters in any case.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames read from `chunks`, each written separately, so that a
    /// header or body cut between reads is read whole.
    fn frames(chunks: &[&[u8]]) -> Vec<Frame> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (mut writer, reader) = tokio::io::duplex(PIPE_BYTES);
            let mut frames = Frames::new(reader);
            let mut read = Vec::new();
            for chunk in chunks {
                writer.write_all(chunk).await.expect("the pipe is open");
                // One read takes the whole chunk, and only it.
                frames.buffer.reserve(PIPE_BYTES);
                frames
                    .reader
                    .read_buf(&mut frames.buffer)
                    .await
                    .expect("the pipe is open");
                read.extend(std::iter::from_fn(|| frames.take()));
            }
            read
        })
    }

    fn body(text: &str) -> Frame {
        Frame::Body(text.as_bytes().to_vec())
    }

    #[test]
    fn header_names_are_read_in_any_case_and_other_headers_are_ignored() {
        assert_eq!(
            frames(&[
                b"content-length: 2\r\n\r\n{}",
                b"Content-Type: application/vscode-jsonrpc\r\nCONTENT-LENGTH:3\r\n\r\n[1]"
            ]),
            [body("{}"), body("[1]")]
        );
    }

    #[test]
    fn a_message_cut_between_reads_is_read_whole() {
        assert_eq!(
            frames(&[b"Content-Len", b"gth: 4\r\n", b"\r\nnu", b"ll"]),
            [body("null")]
        );
    }

    /// Headers without a length are answered once, and their body is
    /// skipped up to the next message, which is read.
    #[test]
    fn the_message_after_malformed_headers_is_read() {
        assert_eq!(
            frames(&[
                b"Content-Type: x\r\n\r\n{\"id\": 1}",
                b"Content-Length: 2\r\n\r\n{}"
            ]),
            [Frame::Malformed, body("{}")]
        );
        assert_eq!(
            frames(&[b"Content-Length: two\r\n\r\n{}Content-Length: 2\r\n\r\n[]"]),
            [Frame::Malformed, body("[]")]
        );
        let junk = vec![b'x'; 3 * MOST_HEADER_BYTES];
        assert_eq!(
            frames(&[&junk, b"Content-Length: 2\r\n\r\n{}"]),
            [Frame::Malformed, body("{}")]
        );
    }

    #[test]
    fn what_is_not_a_json_rpc_message_is_answered_with_its_id_when_it_has_one() {
        let code = |body: &str| {
            judge(body.as_bytes().to_vec())
                .map(|_| ())
                .map_err(|answer| answer.into_parts())
        };
        let refused = |id: Id, error: Error| Err((id, Err(error)));
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}"#),
            Ok(())
        );
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 1, "result": null}"#),
            Ok(())
        );
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 1"#),
            refused(Id::Null, Error::parse_error())
        );
        assert_eq!(
            code(r#"{"id": 7, "method": "shutdown"}"#),
            refused(Id::Number(7), Error::invalid_request())
        );
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": "a", "jsonrpc": "2.0", "method": "x"}"#),
            refused(Id::String("a".into()), Error::invalid_request())
        );
        assert_eq!(code("42"), refused(Id::Null, Error::invalid_request()));
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 77}"#),
            refused(Id::Number(77), Error::invalid_request())
        );
        // A method written empty is a method, one nobody serves: it goes
        // to the server, which answers "method not found".
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 78, "method": ""}"#),
            Ok(())
        );
        assert_eq!(
            code(r#"[{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}]"#),
            refused(Id::Null, Error::invalid_request())
        );
        assert_eq!(
            judge(b"{\"jsonrpc\": \"2.0\", \"method\": \"\xff\"}".to_vec())
                .map(|_| ())
                .map_err(|answer| answer.into_parts()),
            refused(Id::Null, Error::parse_error())
        );
    }

    /// tower-lsp-server drops its own answer to a `$/` request; only a `$/`
    /// notification may go unanswered.
    #[test]
    fn a_request_whose_method_starts_with_dollar_slash_is_answered_method_not_found() {
        assert!(
            judge(br#"{"jsonrpc": "2.0", "method": "$/setTrace", "params": {}}"#.to_vec()).is_ok()
        );
        let answer = judge(br#"{"jsonrpc": "2.0", "id": 3, "method": "$/custom"}"#.to_vec())
            .map(|_| ())
            .map_err(|answer| answer.into_parts());
        let not_found = Error {
            data: Some("$/custom".into()),
            ..Error::method_not_found()
        };
        assert_eq!(answer, Err((Id::Number(3), Err(not_found))));
    }

    /// A lone surrogate's escape is read as U+FFFD, one code unit for one;
    /// pairs, escaped backslashes and other escapes are left as they are.
    #[test]
    fn a_lone_surrogate_is_read_as_a_replacement_character() {
        let mended = |text: &str| without_lone_surrogates(text.to_string());
        assert_eq!(mended(r#""\ud800 }""#), r#""\ufffd }""#);
        assert_eq!(mended(r#""\uDC00\ud800""#), r#""\ufffd\ufffd""#);
        assert_eq!(mended(r#""\ud83c\udf89""#), r#""\ud83c\udf89""#);
        assert_eq!(mended(r#""\\ud800 \n \u0041""#), r#""\\ud800 \n \u0041""#);
        assert_eq!(mended(r#""\ud800\u0041""#), r#""\ufffd\u0041""#);
        assert_eq!(mended(r#""\ud8"#), r#""\ud8"#);
        let edit = r#"{"jsonrpc": "2.0", "method": "x", "params": {"text": "\ud800"}}"#;
        assert!(judge(edit.as_bytes().to_vec()).is_ok());
    }
}
