//! A peer that can vanish without a word: a network namespace joined to this host by a veth
//! pair, with a TCP forwarder inside it. Cutting the namespace's end of the link makes every
//! packet to and from it disappear, as when a host crashes or a firewall drops a connection:
//! no FIN, no RST, nothing on loopback could imitate that. Needs root (`ip netns`, as CI runs).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::process::{Child, Command};

use crate::eventually::eventually;
use crate::procfs::pid_alive;

/// Names of this module's links and namespaces start with this, then the owning process id.
const PREFIX: &str = "pk";

/// A Python forwarder: listens on `argv[1]:argv[2]`, relays each connection to
/// `argv[3]:argv[4]` (Python 3 is on every machine the tests run on).
const FORWARDER: &str = r#"
import asyncio, sys

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()

async def relay(client_reader, client_writer):
    server_reader, server_writer = await asyncio.open_connection(sys.argv[3], int(sys.argv[4]))
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer),
                         return_exceptions=True)

async def main():
    server = await asyncio.start_server(relay, sys.argv[1], int(sys.argv[2]))
    async with server:
        await server.serve_forever()

asyncio.run(main())
"#;

/// A namespace and the veth pair that joins it to the host; removed on drop.
pub struct IsolatedLink {
    namespace: String,
    host_end: String,
    inner_end: String,
    host_addr: Ipv4Addr,
    inner_addr: Ipv4Addr,
    forwarders: Vec<Child>,
}

impl IsolatedLink {
    /// Creates the namespace and the link, both ends up, with a /30 of `10.0.0.0/8` chosen from
    /// this process's id and a counter (so parallel tests and processes do not share one).
    pub async fn create() -> anyhow::Result<IsolatedLink> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        remove_abandoned_links().await;
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{pid}x{n}");
        // 10.(64 + pid's high bits).(pid's low bits).(4n + 1 | 2)
        let net = [
            10,
            64 + ((pid >> 8) % 128) as u8,
            (pid % 256) as u8,
            ((n % 64) * 4) as u8,
        ];
        let link = IsolatedLink {
            namespace: name.clone(),
            host_end: format!("{name}a"),
            inner_end: format!("{name}b"),
            host_addr: Ipv4Addr::new(net[0], net[1], net[2], net[3] + 1),
            inner_addr: Ipv4Addr::new(net[0], net[1], net[2], net[3] + 2),
            forwarders: Vec::new(),
        };
        let (ns, a, b) = (&link.namespace, &link.host_end, &link.inner_end);
        let host_cidr = format!("{}/30", link.host_addr);
        let inner_cidr = format!("{}/30", link.inner_addr);
        ip(&["netns", "add", ns]).await?;
        ip(&["link", "add", a, "type", "veth", "peer", "name", b]).await?;
        ip(&["link", "set", b, "netns", ns]).await?;
        ip(&["addr", "add", &host_cidr, "dev", a]).await?;
        ip(&["link", "set", a, "up"]).await?;
        ip(&["-n", ns, "addr", "add", &inner_cidr, "dev", b]).await?;
        ip(&["-n", ns, "link", "set", b, "up"]).await?;
        ip(&["-n", ns, "link", "set", "lo", "up"]).await?;
        Ok(link)
    }

    /// This host's address on the link: what a server reached through the namespace listens on.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The namespace's address on the link.
    pub fn inner_addr(&self) -> Ipv4Addr {
        self.inner_addr
    }

    /// The `/30` the link's two addresses are in, for a pg_hba.conf rule.
    pub fn cidr(&self) -> String {
        format!("{}/30", Ipv4Addr::from(u32::from(self.host_addr) - 1))
    }

    /// Starts a forwarder inside the namespace from `inner_addr():port` to `to`, and waits until
    /// it accepts connections. Returns the address to connect to.
    pub async fn forward(&mut self, port: u16, to: SocketAddr) -> anyhow::Result<SocketAddr> {
        let child = self
            .command("python3")
            .args(["-c", FORWARDER])
            .arg(self.inner_addr.to_string())
            .arg(port.to_string())
            .arg(to.ip().to_string())
            .arg(to.port().to_string())
            .spawn()
            .context("starting the forwarder in the namespace")?;
        self.forwarders.push(child);
        let addr = SocketAddr::from((self.inner_addr, port));
        let up = eventually(Duration::from_secs(10), || async move {
            tokio::net::TcpStream::connect(addr).await.is_ok()
        })
        .await;
        if !up {
            bail!(
                "the forwarder in {} never listened on {addr}",
                self.namespace
            );
        }
        Ok(addr)
    }

    /// `program` run inside the namespace (`ip netns exec`), with no stdin, killed when
    /// dropped; it reaches this host at [`Self::host_addr`].
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.namespace])
            .arg(program)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Takes the namespace's end of the link down: from now on whatever is sent to it or from
    /// it is lost without an error or a reset, on connections already open.
    pub async fn cut(&self) -> anyhow::Result<()> {
        ip(&[
            "-n",
            &self.namespace,
            "link",
            "set",
            &self.inner_end,
            "down",
        ])
        .await
    }
}

impl Drop for IsolatedLink {
    fn drop(&mut self) {
        for child in &mut self.forwarders {
            let _ = child.start_kill();
        }
        // Deleting one end of a veth pair deletes both.
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_end])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

/// Runs `ip ARGS`, failing with its error output.
async fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .await
        .context("running ip (package iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Removes the links and namespaces of test processes that ended without dropping theirs.
async fn remove_abandoned_links() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output().await else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let owner = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('x').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if owner.is_some_and(|pid| !pid_alive(pid)) {
            let _ = ip(&["link", "del", &format!("{name}a")]).await;
            let _ = ip(&["netns", "del", name]).await;
        }
    }
}
