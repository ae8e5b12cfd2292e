/** A vqueues cluster for the tests: `vqueues dev` (the embedded broker and N nodes) started
 * through the project's CLI, stopped by PID. */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

function python(): string {
  const venv = path.join(REPO, ".venv", "bin", "python");
  return process.env.VQ_PYTHON ?? (existsSync(venv) ? venv : "python3");
}

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer().once("error", () => resolve(false))
      .once("listening", () => s.close(() => resolve(true)))
      .listen(port, "127.0.0.1");
  });
}

async function freePorts(count: number): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const base = 20_000 + Math.floor(Math.random() * 30_000);
    let ok = true;
    for (let k = 0; k < count && ok; k++) ok = await portFree(base + k);
    if (ok) return base;
  }
  throw new Error("no free ports");
}

export class DevCluster {
  constructor(readonly process: ChildProcess, readonly urls: string[]) {}

  /** `env`: the nodes' settings (`VQ_*`) beside the suite's. */
  static async start(nodes: number, partitions = 8, env: Record<string, string> = {}
                     ): Promise<DevCluster> {
    const port = await freePorts(nodes);
    const proc = spawn(python(), ["-m", "vqueues", "dev", "--nodes", String(nodes),
                                  "--partitions", String(partitions),
                                  "--http-port", String(port)], {
      cwd: REPO, stdio: ["ignore", "ignore", "inherit"],
      env: { ...process.env, VQ_SESSION_TIMEOUT_MS: "6000", VQ_HEARTBEAT_INTERVAL_MS: "500",
             VQ_LOG_LEVEL: "warning", ...env },
    });
    const urls = Array.from({ length: nodes }, (_, i) => `http://127.0.0.1:${port + i}`);
    const cluster = new DevCluster(proc, urls);
    const deadline = Date.now() + 90_000;
    for (const url of urls) {
      for (;;) {
        if (proc.exitCode !== null) throw new Error(`vqueues dev exited with ${proc.exitCode}`);
        try {
          const r = await fetch(`${url}/readyz`);
          if (r.status === 200) break;
        } catch {
          // not listening yet
        }
        if (Date.now() > deadline) {
          cluster.stop();
          throw new Error(`${url} not ready`);
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    return cluster;
  }

  /** SIGTERM `vqueues dev` by PID (it stops its broker and nodes), then wait for it. */
  async stop(): Promise<void> {
    if (this.process.exitCode !== null) return;
    const exited = new Promise((r) => this.process.once("exit", r));
    this.process.kill("SIGTERM");
    const timer = setTimeout(() => this.process.kill("SIGKILL"), 30_000);
    await exited;
    clearTimeout(timer);
  }
}
