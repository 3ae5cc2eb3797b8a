//! A TCP proxy in front of the API server that can go silent: while cut, it reads and discards
//! everything in both directions and accepts new connections that then hear nothing, as a network
//! partition that drops packets looks to both ends; while held, it delivers nothing but keeps every
//! byte, and delivers them all once released, as a network that buffers a partition's traffic does. Its connections to the API server come from
//! another loopback address, so the API server's audit log tells its requests apart.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
    task::{JoinHandle, JoinSet},
};

/// A running proxy; dropping it closes every connection.
pub struct BlackholeProxy {
    address: SocketAddr,
    cut: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl BlackholeProxy {
    /// Listens on 127.0.0.1 and forwards to `upstream`, connecting from `source` (e.g. 127.0.0.2).
    pub async fn start(upstream: SocketAddr, source: IpAddr) -> Self {
        Self::start_at("127.0.0.1:0".parse().unwrap(), upstream, source).await
    }

    /// Like [`BlackholeProxy::start`], listening on `listen`.
    pub async fn start_at(listen: SocketAddr, upstream: SocketAddr, source: IpAddr) -> Self {
        let listener = TcpListener::bind(listen).await.unwrap();
        let address = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        let (flag, hold) = (cut.clone(), held.clone());
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let cut = flag.clone();
                let held = hold.clone();
                connections.spawn(async move {
                    let socket = TcpSocket::new_v4().unwrap();
                    socket.bind(SocketAddr::new(source, 0)).unwrap();
                    let Ok(server) = socket.connect(upstream).await else {
                        return;
                    };
                    forward(client, server, cut, held).await;
                });
            }
        });
        Self {
            address,
            cut,
            held,
            task,
        }
    }

    /// The address clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Starts (`true`) or ends (`false`) the silence.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Starts (`true`) or ends (`false`) holding every byte back, to deliver them all at the end.
    pub fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
    }
}

impl Drop for BlackholeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    client: TcpStream,
    server: TcpStream,
    cut: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Towards the API server, a client that closed its end (it exited) still has its held bytes
    // delivered: that direction ends the connection only once it has written everything.
    let upstream = tokio::spawn(pump(client_read, server_write, cut.clone(), held.clone()));
    let downstream = pump(server_read, client_write, cut, held);
    tokio::select! {
        _ = upstream => {}
        () = downstream => {}
    }
}

/// Copies `from` to `to`, dropping what arrives while cut and keeping back what arrives while held.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    cut: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        while held.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Where the test control plane's API server listens (what a proxy forwards to).
pub fn api_server() -> SocketAddr {
    let server =
        std::fs::read_to_string(test_control_plane::control_plane().dir().join("run/server"))
            .unwrap();
    server
        .trim()
        .trim_start_matches("https://")
        .parse()
        .unwrap()
}

/// A copy of the kubeconfig at `path` whose server is `proxy`, written to `to`.
pub fn kubeconfig_through(path: &std::path::Path, proxy: SocketAddr, to: &std::path::Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut replaced = 0;
    let rewritten: Vec<String> = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("server: ") {
            Some(_) => {
                replaced += 1;
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}server: https://{proxy}")
            }
            None => line.to_owned(),
        })
        .collect();
    assert_eq!(replaced, 1, "one server in {}", path.display());
    std::fs::write(to, rewritten.join("\n") + "\n").unwrap();
}
