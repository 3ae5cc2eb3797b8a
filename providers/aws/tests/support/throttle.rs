//! An HTTP/1.1 proxy on 127.0.0.1 in front of moto that answers the first N requests the way EC2
//! throttles (HTTP 503, `RequestLimitExceeded`) and passes the rest through, since moto never throttles.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

/// What the proxy does to requests.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer the first N requests with EC2's `RequestLimitExceeded`.
    Throttle(usize),
    /// Answer the first N requests for this awsQuery action (e.g. `CreateListener`) with a non-retryable
    /// `ValidationError`.
    FailAction(&'static str, usize),
}

/// The proxy; it runs until the test's runtime ends.
pub struct ThrottlingProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Requests answered with `RequestLimitExceeded` so far.
    pub refused: Arc<AtomicUsize>,
}

const FAILED: &str = "<ErrorResponse><Error><Type>Sender</Type><Code>ValidationError</Code><Message>injected by the test</Message></Error><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>";

const THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>";

impl ThrottlingProxy {
    /// Starts a proxy to 127.0.0.1:`upstream` that throttles the first `throttle_first` requests.
    pub async fn start(upstream: u16, throttle_first: usize) -> Self {
        Self::with_fault(upstream, Fault::Throttle(throttle_first)).await
    }

    /// Starts a proxy to 127.0.0.1:`upstream` with `fault`.
    pub async fn with_fault(upstream: u16, fault: Fault) -> Self {
        let (throttle_first, action) = match fault {
            Fault::Throttle(n) => (n, None),
            Fault::FailAction(action, n) => (n, Some(action)),
        };
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy listens");
        let port = listener.local_addr().unwrap().port();
        let remaining = Arc::new(AtomicUsize::new(throttle_first));
        let refused = Arc::new(AtomicUsize::new(0));
        let (rem, refd) = (remaining.clone(), refused.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, upstream, action, rem.clone(), refd.clone()));
            }
        });
        Self { port, refused }
    }
}

/// One HTTP message: its head and body, and whether the connection closes after it.
struct Message {
    bytes: Vec<u8>,
    close: bool,
}

async fn read_message<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<Message> {
    let mut bytes = Vec::new();
    let mut length: Option<usize> = None;
    let mut close = false;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        bytes.extend_from_slice(line.as_bytes());
        let lower = line.to_ascii_lowercase();
        if first {
            close = lower.starts_with("http/1.0");
            first = false;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok();
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
        if line == "\r\n" {
            break;
        }
    }
    match length {
        Some(n) => {
            let mut body = vec![0; n];
            reader.read_exact(&mut body).await.ok()?;
            bytes.extend_from_slice(&body);
        }
        None if !bytes.starts_with(b"GET") && !bytes.starts_with(b"POST") => {
            // A response without a length ends with the connection.
            reader.read_to_end(&mut bytes).await.ok()?;
            close = true;
        }
        None => {}
    }
    Some(Message { bytes, close })
}

async fn serve(
    client: TcpStream,
    upstream: u16,
    action: Option<&'static str>,
    remaining: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) {
    let (read, mut write) = client.into_split();
    let mut client = BufReader::new(read);
    let mut up: Option<BufReader<TcpStream>> = None;
    // `up` lives as long as the client connection.
    while let Some(request) = read_message(&mut client).await {
        let applies = match action {
            None => true,
            Some(action) => {
                String::from_utf8_lossy(&request.bytes).contains(&format!("Action={action}&"))
            }
        };
        let refuse = applies
            && remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if refuse {
            refused.fetch_add(1, Ordering::SeqCst);
            let (status, body) = match action {
                None => ("503 Service Unavailable", THROTTLED),
                Some(_) => ("400 Bad Request", FAILED),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if write.write_all(response.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        if up.is_none() {
            match TcpStream::connect(("127.0.0.1", upstream)).await {
                Ok(stream) => up = Some(BufReader::new(stream)),
                Err(_) => return,
            }
        }
        let Some(conn) = up.as_mut() else { return };
        if conn.get_mut().write_all(&request.bytes).await.is_err() {
            return;
        }
        let Some(response) = read_message(conn).await else {
            return;
        };
        if write.write_all(&response.bytes).await.is_err() {
            return;
        }
        // A response that ends its connection ends the client's too (it may have no length).
        if response.close || request.close {
            return;
        }
    }
}
