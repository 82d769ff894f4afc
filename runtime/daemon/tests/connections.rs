//! Connections a client holds open without playing fair (issue 13): 500
//! idle or trickling connections stayed open indefinitely. A request's
//! header must arrive within 10 s, and a fair client is served as before.

mod common;

use std::time::{Duration, Instant};

use common::{ACME, Flowd};
use flow_tests::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection; how long that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("still open after {limit:?}"),
        }
    }
}

/// Every place of flowd at `address` (1,024 connections), each having sent
/// `first`; `None` where the limit of open files is lower, said once.
async fn every_place(address: &str, first: &[u8]) -> Option<Vec<TcpStream>> {
    let mut held = Vec::new();
    for _ in 0..1024 {
        match TcpStream::connect(address).await {
            Ok(mut stream) => {
                stream.write_all(first).await.unwrap();
                held.push(stream);
            }
            Err(error) if error.raw_os_error() == Some(24) => {
                println!("skipped: the limit of open files is below 1,024 connections");
                return None;
            }
            Err(error) => panic!("{error}"),
        }
    }
    Some(held)
}

#[tokio::test]
async fn silent_and_trickling_clients_are_cut_off_fair_ones_are_served() {
    let dir = TempDir::new("flowd-connections");
    let flowd = Flowd::start(&dir);
    let address = flowd.url.trim_start_matches("http://").to_string();

    // Says nothing at all.
    let mut silent = TcpStream::connect(&address).await.unwrap();
    // Sends its header a byte every half second, never finishing it.
    let mut trickling = TcpStream::connect(&address).await.unwrap();
    let trickle = tokio::spawn(async move {
        let header = b"GET /v1/runs HTTP/1.1\r\nHost: flow\r\nX-Slow: ";
        trickling.write_all(header).await.unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if trickling.write_all(b"a").await.is_err() {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("the trickling client was never cut off");
    });

    // Meanwhile, a fair client is served.
    let (status, _) = flowd
        .send(reqwest::Method::GET, "/v1/runs", Some(ACME), None)
        .await;
    assert_eq!(status, 200);

    let silent_for = closed_within(&mut silent, Duration::from_secs(20)).await;
    assert!(silent_for <= Duration::from_secs(15), "{silent_for:?}");
    let trickled_for = trickle.await.unwrap();
    assert!(trickled_for <= Duration::from_secs(15), "{trickled_for:?}");
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression (an audit): one client holding every place (1,024
/// connections kept alive, a request on each every few seconds) shut every
/// other client out. A new connection takes the place of the one idle the
/// longest.
#[tokio::test]
async fn idle_connections_make_room_for_a_new_client() {
    let dir = TempDir::new("flowd-connections-full");
    let flowd = Flowd::start(&dir);
    let address = flowd.url.trim_start_matches("http://").to_string();
    // Answered 401, and then kept alive.
    let Some(held) = every_place(&address, b"GET /v1/runs HTTP/1.1\r\nHost: flow\r\n\r\n").await
    else {
        return;
    };
    // Every place is taken, by connections idle for over a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, _) = flowd
        .send(reqwest::Method::GET, "/v1/runs", Some(ACME), None)
        .await;
    assert_eq!(status, 200);
    drop(held);
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression (an audit): a client holding every place with headers it
/// trickled and never finished, a byte on each connection in turn, kept
/// each from being idle, and fair clients were refused. A connection that
/// has not begun a request for a second gives up its place.
#[tokio::test]
async fn trickled_headers_make_room_for_a_new_client() {
    let dir = TempDir::new("flowd-connections-trickled");
    let flowd = Flowd::start(&dir);
    let address = flowd.url.trim_start_matches("http://").to_string();
    let Some(mut held) =
        every_place(&address, b"GET /v1/runs HTTP/1.1\r\nHost: flow\r\nX-Slow: ").await
    else {
        return;
    };
    // Every connection moves a byte every 200 ms, for longer than a
    // connection must go without a request to give up its place.
    let trickle = tokio::spawn(async move {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            for stream in &mut held {
                let _ = stream.write_all(b"a").await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        held
    });
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let (status, _) = flowd
        .send(reqwest::Method::GET, "/v1/runs", Some(ACME), None)
        .await;
    assert_eq!(status, 200);
    drop(trickle.await.unwrap());
    assert_eq!(flowd.stop(), Some(0));
}

/// A request whose body does not arrive whole within 30 s of its header
/// is answered 408 with a problem, and its connection closed. Regression
/// (an audit): a body sent a byte every few seconds held its connection
/// for good, and one that stalled was dropped without an answer.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    let dir = TempDir::new("flowd-connections-body");
    let flowd = Flowd::start(&dir);
    let address = flowd.url.trim_start_matches("http://").to_string();
    let mut trickling = TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: flow\r\nAuthorization: Bearer {ACME}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    trickling.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        // A byte every 5 s: never idle for long, never done.
        let _ = trickling.write_all(b" ").await;
        match tokio::time::timeout(Duration::from_secs(5), trickling.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(read)) => answer.extend_from_slice(&buf[..read]),
            Err(_) => assert!(started.elapsed() < Duration::from_secs(50), "no answer"),
        }
        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_secs(29),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(flowd.stop(), Some(0));
}
