//! Benchmark tool of the data plane (driven by `bench/data-plane/run`; not run in CI).
//!
//! ```text
//! dp-bench lb VIP BACKEND_IP PORT:NODE_PORT...   run a DataPlane with one TCP load balancer until SIGTERM
//! dp-bench echo ADDR                             TCP echo server
//! dp-bench latency ADDR CONNS SECS SIZE [RATE]   request/response latency over CONNS concurrent connections,
//!                                                at RATE requests/s in all (0 or absent: as fast as they can)
//! dp-bench connrate ADDR WORKERS SECS            new connections per second (connect, 1-byte echo, close)
//! dp-bench idle ADDR CONNS SECS [SOURCES]        opens CONNS idle connections, prints "open N", holds them SECS;
//!                                                from SOURCES client addresses (127.50.2.1, .2, ...; default 1)
//! dp-bench http ADDR CONNS SECS [RATE]           as `latency`, each request a `GET /` on keep-alive HTTP/1.1
//!                                                connections (for an HTTP server behind the address)
//! dp-bench httprate ADDR WORKERS SECS            as `connrate`, each connection one `GET /` (Connection: close)
//! ```
//! Every measuring command prints one JSON object on stdout.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use local_data_plane::{Backend, DataPlane, ListenerSpec, LoadBalancerSpec, Protocol, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    // Scheduler knobs, for measuring their effect on the proxy's tail (bench/data-plane/run passes
    // LB_EVENT_INTERVAL to the `lb` process): how many tasks a worker polls between two looks at the
    // I/O driver. Unset or empty: the `lb` process runs with what the shipped data plane runs with
    // (RUNTIME_EVENT_INTERVAL), the load generators and the echo backend with tokio's default.
    let event_interval = match std::env::var("DP_BENCH_EVENT_INTERVAL")
        .ok()
        .filter(|v| !v.is_empty())
    {
        None => (args.first().map(String::as_str) == Some("lb"))
            .then_some(local_data_plane::RUNTIME_EVENT_INTERVAL),
        Some(raw) => match raw.parse::<u32>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                eprintln!("DP_BENCH_EVENT_INTERVAL={raw:?}: must be a whole number above 0");
                return ExitCode::FAILURE;
            }
        },
    };
    if let Some(n) = event_interval {
        builder.event_interval(n);
    }
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("dp-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn arg<T: FromStr>(args: &[String], i: usize, what: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    let raw = args.get(i).ok_or_else(|| format!("missing {what}"))?;
    raw.parse()
        .map_err(|e| format!("bad {what} {raw:?}: {e}").into())
}

async fn run(args: Vec<String>) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("lb") => lb(&args).await,
        Some("echo") => echo(arg(&args, 1, "address")?).await,
        Some("latency") => {
            latency(
                arg(&args, 1, "address")?,
                arg(&args, 2, "connections")?,
                arg(&args, 3, "seconds")?,
                arg(&args, 4, "size")?,
                if args.len() > 5 {
                    arg(&args, 5, "rate")?
                } else {
                    0.0
                },
            )
            .await
        }
        Some("http") => {
            exchange_latency(
                arg(&args, 1, "address")?,
                arg(&args, 2, "connections")?,
                arg(&args, 3, "seconds")?,
                Exchange::Http,
                if args.len() > 4 {
                    arg(&args, 4, "rate")?
                } else {
                    0.0
                },
            )
            .await
        }
        Some("httprate") => {
            connection_rate(
                arg(&args, 1, "address")?,
                arg(&args, 2, "workers")?,
                arg(&args, 3, "seconds")?,
                Exchange::Http,
            )
            .await
        }
        Some("connrate") => {
            connrate(
                arg(&args, 1, "address")?,
                arg(&args, 2, "workers")?,
                arg(&args, 3, "seconds")?,
            )
            .await
        }
        Some("idle") => {
            idle(
                arg(&args, 1, "address")?,
                arg(&args, 2, "connections")?,
                arg(&args, 3, "seconds")?,
                if args.len() > 4 {
                    arg(&args, 4, "sources")?
                } else {
                    1
                },
            )
            .await
        }
        _ => Err(
            "usage: dp-bench lb|echo|latency|connrate|idle|http|httprate ... (see the source)"
                .into(),
        ),
    }
}

async fn lb(args: &[String]) -> Result<()> {
    let vip: IpAddr = arg(args, 1, "VIP")?;
    let backend: IpAddr = arg(args, 2, "backend IP")?;
    let mut listeners = Vec::new();
    for pair in &args[3..] {
        let (port, node_port) = pair.split_once(':').ok_or("ports are PORT:NODE_PORT")?;
        listeners.push(ListenerSpec {
            vip,
            port: port.parse()?,
            protocol: Protocol::Tcp,
            node_port: node_port.parse()?,
        });
    }
    let plane = DataPlane::new(Settings::default());
    plane
        .apply(LoadBalancerSpec {
            name: "bench".into(),
            listeners,
            backends: vec![Backend {
                node: "node".into(),
                address: backend,
            }],
            health_check: None,
            session_affinity: None,
            source_ranges: Vec::new(),
            proxy_protocol: false,
        })
        .await?;
    println!("ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

async fn echo(addr: SocketAddr) -> Result<()> {
    let listener = bind(addr)?;
    println!("ready");
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(TcpListener::from_std(socket.into())?)
}

/// What one request/response is.
#[derive(Debug, Clone, Copy)]
enum Exchange {
    /// SIZE bytes, echoed back.
    Echo(usize),
    /// `GET /` and an HTTP/1.1 response with a Content-Length.
    Http,
}

const HTTP_GET: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n";
const HTTP_GET_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";

/// One exchange on `stream`; `Err` when the connection failed or answered something else.
async fn exchange(
    stream: &mut tokio::io::BufReader<TcpStream>,
    how: Exchange,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    use tokio::io::AsyncBufReadExt;
    match how {
        Exchange::Echo(size) => {
            scratch.resize(size, b'x');
            stream.get_mut().write_all(scratch).await?;
            stream.read_exact(scratch).await.map(drop)
        }
        Exchange::Http => {
            stream.get_mut().write_all(HTTP_GET).await?;
            let mut length = None;
            loop {
                scratch.clear();
                if stream.read_until(b'\n', scratch).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                let line = String::from_utf8_lossy(scratch)
                    .trim_end()
                    .to_ascii_lowercase();
                if line.is_empty() {
                    break;
                }
                if let Some(value) = line.strip_prefix("content-length:") {
                    length = value.trim().parse::<usize>().ok();
                }
            }
            let length = length.ok_or(std::io::ErrorKind::InvalidData)?;
            scratch.resize(length, 0);
            stream.read_exact(scratch).await.map(drop)
        }
    }
}

async fn latency(addr: SocketAddr, conns: usize, secs: f64, size: usize, rate: f64) -> Result<()> {
    exchange_latency(addr, conns, secs, Exchange::Echo(size), rate).await
}

async fn exchange_latency(
    addr: SocketAddr,
    conns: usize,
    secs: f64,
    how: Exchange,
    rate: f64,
) -> Result<()> {
    let warmup = Duration::from_millis(500);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + Duration::from_secs_f64(secs);
    let errors = Arc::new(AtomicU64::new(0));
    // Every request, warm-up included (for CPU per request).
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..conns {
        let errors = errors.clone();
        let total = total.clone();
        tasks.spawn(async move {
            // Stagger the connects over the warm-up.
            tokio::time::sleep(warmup.mul_f64(i as f64 / conns as f64 / 2.0)).await;
            let mut samples = Vec::new();
            let Ok(stream) = TcpStream::connect(addr).await else {
                errors.fetch_add(1, Ordering::Relaxed);
                return samples;
            };
            let _ = stream.set_nodelay(true);
            let mut stream = tokio::io::BufReader::new(stream);
            let mut scratch = Vec::new();
            // Open loop at rate / conns per connection, phases spread evenly; or closed loop.
            let mut ticker = (rate > 0.0).then(|| {
                let period = Duration::from_secs_f64(conns as f64 / rate);
                let first = tokio::time::Instant::now() + period.mul_f64(i as f64 / conns as f64);
                let mut ticker = tokio::time::interval_at(first, period);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticker
            });
            loop {
                if let Some(ticker) = ticker.as_mut() {
                    ticker.tick().await;
                }
                let t0 = Instant::now();
                if t0 >= end {
                    return samples;
                }
                if exchange(&mut stream, how, &mut scratch).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                    return samples;
                }
                total.fetch_add(1, Ordering::Relaxed);
                if t0 >= measure_from {
                    samples.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
            }
        });
    }
    let mut all: Vec<u32> = Vec::new();
    while let Some(samples) = tasks.join_next().await {
        all.extend(samples?);
    }
    all.sort_unstable();
    let pct = |p: f64| -> u32 {
        if all.is_empty() {
            0
        } else {
            all[((all.len() - 1) as f64 * p).round() as usize]
        }
    };
    println!(
        "{{\"requests\":{},\"total_requests\":{},\"rps\":{:.0},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"errors\":{}}}",
        all.len(),
        total.load(Ordering::Relaxed),
        all.len() as f64 / secs,
        pct(0.50),
        pct(0.99),
        pct(0.999),
        errors.load(Ordering::Relaxed)
    );
    Ok(())
}

async fn connrate(addr: SocketAddr, workers: usize, secs: f64) -> Result<()> {
    connection_rate(addr, workers, secs, Exchange::Echo(1)).await
}

async fn connection_rate(addr: SocketAddr, workers: usize, secs: f64, how: Exchange) -> Result<()> {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let done = done.clone();
        let errors = errors.clone();
        tasks.spawn(async move {
            let mut byte = [0u8; 1];
            while Instant::now() < end {
                let ok = async {
                    let mut stream = TcpStream::connect(addr).await.ok()?;
                    match how {
                        Exchange::Echo(_) => {
                            stream.write_all(b"x").await.ok()?;
                            stream.read_exact(&mut byte).await.ok()?;
                        }
                        Exchange::Http => {
                            stream.write_all(HTTP_GET_CLOSE).await.ok()?;
                            let mut response = Vec::new();
                            stream.read_to_end(&mut response).await.ok()?;
                            response.starts_with(b"HTTP/1.1 200").then_some(())?;
                        }
                    }
                    Some(())
                }
                .await;
                if ok.is_some() {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed().as_secs_f64();
    let done = done.load(Ordering::Relaxed);
    println!(
        "{{\"connections\":{},\"per_second\":{:.0},\"errors\":{}}}",
        done,
        done as f64 / elapsed,
        errors.load(Ordering::Relaxed)
    );
    Ok(())
}

/// The `n`th (from 0) of `sources` client addresses an idle connection comes from: one client
/// address may hold only a quarter of the proxy's descriptors (its budget, issue #32), so a test of
/// more connections than that spreads them over several, as many clients would.
fn idle_source(n: usize, sources: u8) -> Option<SocketAddr> {
    (sources > 1).then(|| {
        let host = u8::try_from(n % usize::from(sources)).unwrap_or(0) + 1;
        SocketAddr::from(([127, 50, 2, host], 0))
    })
}

async fn idle(addr: SocketAddr, conns: usize, secs: f64, sources: u8) -> Result<()> {
    if sources == 0 {
        return Err("sources must be 1 or more".into());
    }
    let mut streams = Vec::with_capacity(conns);
    let mut pending = tokio::task::JoinSet::new();
    // Failed connects, by error (e.g. the machine out of ephemeral ports: "Cannot assign requested address").
    let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
    let mut settle = |result: std::io::Result<TcpStream>| match result {
        Ok(stream) => streams.push(stream),
        Err(error) => *errors.entry(error.to_string()).or_default() += 1,
    };
    for n in 0..conns {
        if pending.len() >= 256
            && let Some(result) = pending.join_next().await
        {
            settle(result?);
        }
        let source = idle_source(n, sources);
        pending.spawn(async move {
            match source {
                None => TcpStream::connect(addr).await,
                Some(source) => {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind(source)?;
                    socket.connect(addr).await
                }
            }
        });
    }
    while let Some(result) = pending.join_next().await {
        settle(result?);
    }
    // A proxy may accept a connection and reset it at once (past a descriptor share): only the ones
    // still open a moment later are held by it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alive = streams
        .iter()
        .filter(|s| {
            matches!(s.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    let failed: u64 = errors.values().sum();
    let kinds: Vec<String> = errors.iter().map(|(e, n)| format!("{e:?}: {n}")).collect();
    println!(
        "{{\"open\":{},\"alive\":{alive},\"errors\":{failed},\"error_kinds\":{{{}}}}}",
        streams.len(),
        kinds.join(",")
    );
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    drop(streams);
    Ok(())
}
