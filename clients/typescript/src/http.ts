import * as http from "node:http";
import * as https from "node:https";

/** One HTTP answer: status, headers, and the body parsed as JSON (undefined when empty). */
export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: unknown;
}

export interface TransportOptions {
  /** A PEM bundle (or several) that signed the nodes' certificates, for https:// URLs. */
  ca?: string | Buffer | Array<string | Buffer>;
  /** The longest a request may take, ms. */
  requestTimeoutMs: number;
}

/**
 * JSON over node:http / node:https with kept-alive connections. Node's own modules, not
 * `fetch`: Node 20's fetch takes no CA of its own for a private CA (only the process-wide
 * NODE_EXTRA_CA_CERTS), and the client must verify nodes signed by one.
 */
export class Transport {
  private readonly httpAgent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  private readonly httpsAgent: https.Agent;
  private readonly timeoutMs: number;

  constructor(options: TransportOptions) {
    this.httpsAgent = new https.Agent({ keepAlive: true, maxSockets: 64, ca: options.ca });
    this.timeoutMs = options.requestTimeoutMs;
  }

  request(method: string, url: string, body: unknown, headers: Record<string, string>,
          signal?: AbortSignal): Promise<Answer> {
    const target = new URL(url);
    const secure = target.protocol === "https:";
    // A Buffer is a body already encoded as JSON (the multi-queue enqueue sizes its own).
    const payload = body === undefined ? undefined :
      Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const options: https.RequestOptions = {
      method,
      agent: secure ? this.httpsAgent : this.httpAgent,
      headers: {
        Accept: "application/json",
        ...(payload ? { "Content-Type": "application/json",
                        "Content-Length": String(payload.length) } : {}),
        ...headers,
      },
      timeout: this.timeoutMs,
      signal,
    };
    return new Promise<Answer>((resolve, reject) => {
      const req = (secure ? https : http).request(target, options, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let parsed: unknown = undefined;
          if (text) {
            try {
              parsed = JSON.parse(text);
            } catch {
              parsed = { error: { code: "http_error", message: text.slice(0, 200) } };
            }
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: parsed });
        });
      });
      req.on("timeout", () => req.destroy(new Error(`no answer within ${this.timeoutMs} ms`)));
      req.on("error", reject);
      req.end(payload);
    });
  }

  close(): void {
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
  }
}
