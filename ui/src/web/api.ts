// The device side of HTTP API v1 for the web companion — pairing, read sessions, snapshot,
// thread detail, blobs, the event stream and signed commands — as the Rust companion's
// `api.rs` speaks it, over `fetch` from the page's own origin.
import { createParser, type EventSourceMessage } from "eventsource-parser";
import type { CommandResult, Device, DeviceSession, Event, SignedEnvelope } from "./wire";

/** Why a call failed, in the shape the screens already show (`AppError`-like). */
export class ApiError extends Error {
  constructor(
    readonly kind: "unreachable" | "refused" | "protocol" | "cursor_expired",
    message: string,
    readonly code: string | null = null,
  ) {
    super(message);
  }
}

export class Api {
  constructor(readonly base: string = "") {}

  private async call(path: string, init: RequestInit): Promise<Response> {
    try {
      return await fetch(this.base + path, init);
    } catch (e) {
      throw new ApiError("unreachable", `cannot reach the server — ${(e as Error).message ?? e}`);
    }
  }

  private async decode<T>(res: Response): Promise<T> {
    const text = await res.text();
    if (res.ok) {
      try {
        return JSON.parse(text) as T;
      } catch {
        throw new ApiError("protocol", `unexpected answer from the server (${res.status})`);
      }
    }
    let problem: { code?: string; detail?: string; reason?: string } | null = null;
    try {
      problem = JSON.parse(text);
    } catch {
      /* not a problem document */
    }
    if (problem?.code === "cursor_expired") throw new ApiError("cursor_expired", problem.detail ?? "the event cursor expired", "cursor_expired");
    if (problem) throw new ApiError("refused", `${problem.detail ?? res.statusText} (${problem.code ?? problem.reason ?? res.status})`, problem.code ?? problem.reason ?? null);
    throw new ApiError("protocol", `the server answered ${res.status}`);
  }

  async pair(code: string, publicKey: string, name: string): Promise<Device> {
    const res = await this.call("/v1/devices/pair", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ code, public_key: publicKey, name }) });
    return this.decode<Device>(res);
  }

  async openSession(deviceId: string, env: SignedEnvelope): Promise<DeviceSession> {
    const res = await this.call(`/v1/devices/${encodeURIComponent(deviceId)}/session`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(env) });
    return this.decode<DeviceSession>(res);
  }

  async get<T>(token: string, path: string): Promise<T> {
    const res = await this.call(path, { headers: { authorization: `Bearer ${token}` } });
    return this.decode<T>(res);
  }

  async post<T>(token: string, path: string, body: unknown): Promise<T> {
    const res = await this.call(path, { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(body) });
    return this.decode<T>(res);
  }

  async put<T>(token: string, path: string, body: unknown): Promise<T> {
    const res = await this.call(path, { method: "PUT", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(body) });
    return this.decode<T>(res);
  }

  /** A `DELETE` answered `204 No Content` (or a problem). */
  async delete(token: string, path: string): Promise<void> {
    const res = await this.call(path, { method: "DELETE", headers: { authorization: `Bearer ${token}` } });
    if (!res.ok) await this.decode<unknown>(res);
  }

  async blob(token: string, sha256: string): Promise<Uint8Array> {
    const res = await this.call(`/v1/blobs/${sha256}`, { headers: { authorization: `Bearer ${token}` } });
    if (!res.ok) await this.decode<unknown>(res);
    return new Uint8Array(await res.arrayBuffer());
  }

  /** A command's answer: a `CommandResult` on every status (200, 409, 403, 422). */
  async submit(env: SignedEnvelope): Promise<CommandResult> {
    const res = await this.call("/v1/commands", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(env) });
    const text = await res.text();
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      throw new ApiError("protocol", `the server answered ${res.status} to a command`);
    }
    const b = body as { status?: string; code?: string; detail?: string };
    if (typeof b.status === "string" && ["applied", "duplicate", "conflict", "rejected"].includes(b.status)) return body as CommandResult;
    throw new ApiError("refused", `${b.detail ?? res.statusText} (${b.code ?? res.status})`, b.code ?? null);
  }

  /**
   * Follows the event stream after `after`, calling `onEvent` for each event in order, until
   * the stream ends (resolves) or `signal` aborts. Over `fetch`, so the read session travels
   * in the Authorization header as everywhere else.
   */
  async events(token: string, after: number, onEvent: (e: Event) => void, signal: AbortSignal): Promise<void> {
    let res: Response;
    try {
      res = await fetch(`${this.base}/v1/events?after=${after}`, { headers: { authorization: `Bearer ${token}`, accept: "text/event-stream" }, signal });
    } catch (e) {
      if (signal.aborted) return;
      throw new ApiError("unreachable", `cannot reach the server — ${(e as Error).message ?? e}`);
    }
    if (!res.ok || !res.body) {
      await this.decode<unknown>(res);
      return;
    }
    let failure: Error | null = null;
    const parser = createParser({
      onEvent(m: EventSourceMessage) {
        if (failure || !m.data) return;
        if (m.event === "cursor_expired") {
          failure = new ApiError("cursor_expired", "the event cursor is older than the server keeps", "cursor_expired");
          return;
        }
        try {
          onEvent(JSON.parse(m.data) as Event);
        } catch (e) {
          failure = e as Error;
        }
      },
    });
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.feed(value);
        if (failure) throw failure;
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError) throw e;
      throw new ApiError("unreachable", `the event stream broke — ${(e as Error).message ?? e}`);
    } finally {
      reader.releaseLock();
    }
  }
}
