// The web companion: what the Tauri shell does for the desktop app — pairing, the read session,
// sync into the SQLite mirror, signed commands through the outbox — done in the page, behind
// the same `commands`/`events` the screens already use (src/data.ts picks one or the other).
import { BackoffOptions, backOff } from "exponential-backoff";
import { del, set } from "idb-keyval";
import type {
  ArtifactText,
  DecideOp,
  DeliveryStep,
  DeviceView,
  DelegatesView,
  EscalationPolicyView,
  InboxItemView,
  MachineView,
  MirrorChanged,
  Navigate,
  NewRuleView,
  OutboxView,
  RuleAddedView,
  RulesView,
  SeenView,
  StartRunView,
  StartedRunView,
  StatusChanged,
  StatusView,
  SteerOp,
  SyncView,
  ThreadDetailView,
  ThreadRowView,
} from "../bindings";
import { Api, ApiError } from "./api";
import { type Db, openBrowserDb } from "./db";
import { type DeviceKey, loadOrCreateKey, pendingKey } from "./keys";
import { type Identity, MirrorError, WebMirror } from "./mirror";
import { addRuleArgs, answerArgs, approveEditedArgs, commandId, newCommand, signCommand, type Seen } from "./sign";
import { inboxItemView, machineView, outboxView, rulesView, threadDetailView, threadRowView } from "./views";
import type { Operation, OutboxStatus } from "../bindings";
import type {
  CommandResult,
  Delegates,
  Delegation,
  Device,
  EscalationPolicy,
  Event,
  Health,
  MachineList,
  PostReceipts,
  ReceiptsRecorded,
  RuleList,
  Snapshot,
  TaskDetail,
  VapidKey,
} from "./wire";

/** Where the page keeps its read session: the service worker reads it to describe a push. */
export const SESSION_KEY = "waymark-session";

export type Listener<T> = (e: { payload: T }) => void;

class Channel<T> {
  private listeners = new Set<Listener<T>>();
  listen(f: Listener<T>): Promise<() => void> {
    this.listeners.add(f);
    return Promise.resolve(() => void this.listeners.delete(f));
  }
  emit(payload: T): void {
    for (const f of [...this.listeners]) f({ payload });
  }
}

/** A failure as the screens show it (the shell's `AppError` shape). */
function appError(e: unknown): Error {
  if (e instanceof ApiError || e instanceof MirrorError || e instanceof Error) return e;
  return new Error(String(e));
}

/** `https://host/app/#/pair?code=…` (the web companion's link), or `waymark://pair?server=…&code=…`. */
export function parseWebPairingLink(link: string, origin: string): { server: string; code: string } {
  const text = link.trim();
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new Error(`\`${text}\` is not a pairing link like ${origin}/app/#/pair?code=…`);
  }
  let server: string;
  let code: string | null;
  if (url.protocol === "waymark:") {
    server = url.searchParams.get("server") ?? "";
    code = url.searchParams.get("code");
  } else if (url.protocol === "https:" || url.protocol === "http:") {
    server = url.origin;
    const query = url.hash.includes("?") ? url.hash.slice(url.hash.indexOf("?") + 1) : url.search.slice(1);
    code = new URLSearchParams(query).get("code");
  } else {
    throw new Error(`unsupported link scheme \`${url.protocol.replace(/:$/, "")}\``);
  }
  if (!code) throw new Error("the link has no `code`");
  if (server.replace(/\/$/, "") !== origin) {
    throw new Error(`this page pairs with its own server (${origin}); open the link's server at ${server.replace(/\/$/, "")}/app/ instead`);
  }
  return { server: origin, code };
}

/** The web companion's state: one per page. */
export class WebCompanion {
  readonly mirrorChanged = new Channel<MirrorChanged>();
  readonly statusChanged = new Channel<StatusChanged>();
  readonly navigate = new Channel<Navigate>();
  private session: { token: string; expires: number } | null = null;
  private key: DeviceKey | null = null;
  private following: AbortController | null = null;
  private health = { connected: false, reachable: false, lastSyncAt: null as number | null, reconnectingSince: null as number | null, lastError: null as string | null };

  constructor(
    readonly mirror: WebMirror,
    readonly db: Db,
    readonly api: Api = new Api(apiBase()),
    private readonly origin: string = window.location.origin,
  ) {}

  static async open(): Promise<WebCompanion> {
    const db = await openBrowserDb();
    return new WebCompanion(new WebMirror(db), db);
  }

  private async identity(): Promise<Identity> {
    const id = await this.mirror.identity();
    if (!id) throw new Error("this phone is not paired yet — open the pairing link from `waymark admin pair`");
    return id;
  }

  private async deviceKey(): Promise<DeviceKey> {
    this.key ??= await loadOrCreateKey();
    return this.key;
  }

  async pair(link: string, code: string | null, name: string | null): Promise<StatusView> {
    if (!window.isSecureContext) throw new Error("a browser makes device keys only on https:// or localhost: open this page over https (docs/phone.md)");
    const parsed = parseWebPairingLink(code ? `${link.replace(/#.*$/, "")}#/pair?code=${encodeURIComponent(code)}` : link, this.origin);
    // A new key is made for the new pairing, and replaces this device's key (and its mirror)
    // only once the server accepted it: a refused code — wrong, used, expired — or a link
    // opened by mistake leaves the pairing this browser has working.
    const key = await pendingKey();
    const device = await this.api.pair(parsed.code, key.publicKey, name ?? defaultName());
    await key.keep();
    this.key = null;
    this.session = null;
    await del(SESSION_KEY);
    await this.mirror.reset();
    await this.mirror.setIdentity({ server: parsed.server, device_id: device.id, user: device.user, scopes: device.scopes });
    this.statusChanged.emit({});
    void this.start();
    return this.status();
  }

  /** A read session, opened with a signed `open_session` when there is none or it ran out. */
  private async token(): Promise<string> {
    if (this.session && this.session.expires - Date.now() > 30_000) return this.session.token;
    const id = await this.identity();
    const key = await this.deviceKey();
    const cmd = newCommand({ taskId: null, operation: "open_session", expectedPlanRevision: null, user: id.user, deviceId: id.device_id });
    const s = await this.api.openSession(id.device_id, (await signCommand(key, cmd)));
    this.session = { token: s.token, expires: Date.parse(s.expires_at) };
    // The service worker reads it too: to describe a push, and to say it showed and opened it.
    await set(SESSION_KEY, { token: s.token, expires_at: s.expires_at, device_id: id.device_id, user: id.user });
    return s.token;
  }

  private async resnapshot(token: string): Promise<number> {
    // `TaskSummary` flattens its task: the id is at the top of each entry.
    const snap = await this.api.get<Snapshot>(token, "/v1/snapshot");
    const threads: TaskDetail[] = [];
    for (const t of snap.tasks) threads.push(await this.api.get<TaskDetail>(token, `/v1/tasks/${encodeURIComponent(t.id)}`));
    await this.mirror.applySnapshot(snap.cursor, threads);
    return snap.cursor;
  }

  /** Sends queued commands in the order they were made; each until the server answers. */
  async deliverOutbox(): Promise<OutboxView[]> {
    const queued = await this.mirror.queued();
    const done: OutboxView[] = [];
    for (const [commandId, env] of queued) {
      const res = await this.api.submit(env);
      const effective: CommandResult = res.status === "duplicate" && res.original ? res.original : res;
      const status: OutboxStatus =
        effective.status === "applied" || effective.status === "duplicate"
          ? "delivered"
          : effective.status === "conflict"
            ? "conflict"
            : effective.reason === "expired"
              ? "expired"
              : "rejected";
      await this.mirror.recordResult(commandId, status, effective);
      const entry = (await this.mirror.outbox(null)).find((e) => e.command_id === commandId);
      if (entry) done.push(outboxView(entry));
    }
    if (queued.length) this.mirrorChanged.emit({});
    return done;
  }

  /** Delivers the outbox, then catches up: a snapshot when there is no cursor (or it expired),
   * then the event stream until it reaches where the log stood when the sync began — as the
   * Rust companion's `sync_once`. */
  async syncOnce(): Promise<SyncView> {
    try {
      const token = await this.token();
      const delivered = await this.deliverOutbox();
      let snapshot = false;
      let cursor = await this.mirror.cursor();
      if (cursor === null) {
        snapshot = true;
        cursor = await this.resnapshot(token);
      }
      let events = 0;
      for (;;) {
        try {
          events += await this.catchUp(token);
          break;
        } catch (e) {
          if (!(e instanceof ApiError && e.kind === "cursor_expired")) throw e;
          snapshot = true;
          await this.resnapshot(token);
        }
      }
      cursor = (await this.mirror.cursor()) ?? cursor;
      await this.fetchedReceipts(token);
      this.health = { ...this.health, reachable: true, lastSyncAt: Date.now(), lastError: null, reconnectingSince: null };
      this.mirrorChanged.emit({});
      this.statusChanged.emit({});
      return { events, snapshot, delivered, cursor };
    } catch (e) {
      this.failed(e);
      throw appError(e);
    }
  }

  /** Applies the event stream from the mirror's cursor until it reaches the log's head as it
   * stood at the start, in batches of 2,048 (one transaction each); the number applied. */
  async catchUp(token?: string): Promise<number> {
    const t = token ?? (await this.token());
    const head = (await this.api.get<Health>(t, "/healthz")).cursor;
    let cursor = (await this.mirror.cursor()) ?? 0;
    if (cursor >= head) return 0;
    const stop = new AbortController();
    let batch: Event[] = [];
    let applied = 0;
    let writing: Promise<void> = Promise.resolve();
    const flush = () => {
      const events = batch;
      batch = [];
      applied += events.length;
      writing = writing.then(() => (events.length ? this.mirror.applyEvents(events) : undefined));
    };
    // The head counts every user's events: past it, or after a pause with nothing new (the
    // rest were someone else's), this device is caught up.
    let idle = setTimeout(() => stop.abort(), 2000);
    try {
      await this.api.events(
        t,
        cursor,
        (e) => {
          batch.push(e);
          cursor = Math.max(cursor, e.cursor);
          if (batch.length >= 2048) flush();
          clearTimeout(idle);
          if (cursor >= head) stop.abort();
          else idle = setTimeout(() => stop.abort(), 400);
        },
        stop.signal,
      );
    } finally {
      clearTimeout(idle);
    }
    flush();
    await writing;
    return applied;
  }

  /** Tells the server how far decisions reached this phone (`fetched`, `shown`, `opened`),
   * skipping steps the mirror shows recorded — `Companion::report_receipts`. */
  async reportReceipts(decisionIds: readonly string[], step: DeliveryStep, token?: string): Promise<number> {
    const id = await this.identity();
    const receipts: PostReceipts["receipts"] = [];
    for (const d of decisionIds) {
      const dec = await this.mirror.decision(d);
      if (dec && !(dec.deliveries ?? []).some((x) => x.device_id === id.device_id && x.step === step)) receipts.push({ decision_id: dec.id, step });
    }
    let recorded = 0;
    for (let i = 0; i < receipts.length; i += 200) {
      const body: PostReceipts = { receipts: receipts.slice(i, i + 200) };
      const r = await this.api.post<ReceiptsRecorded>(token ?? (await this.token()), `/v1/devices/${encodeURIComponent(id.device_id)}/receipts`, body);
      recorded += r.recorded;
    }
    return recorded;
  }

  /** The pending decisions this phone has not said it fetched; a failure only waits for the
   * next batch (proof of delivery never stops a sync). */
  private async fetchedReceipts(token: string): Promise<void> {
    try {
      const ids = (await this.mirror.inbox()).map((i) => i.decision.id);
      await this.reportReceipts(ids, "fetched", token);
    } catch (e) {
      console.info("waymark: could not report the decisions fetched", e);
    }
  }

  private failed(e: unknown) {
    this.health = { ...this.health, connected: false, reachable: !(e instanceof ApiError && e.kind === "unreachable"), lastError: (e as Error)?.message ?? String(e), reconnectingSince: this.health.reconnectingSince ?? Date.now() };
    this.statusChanged.emit({});
  }

  /** Follows the event stream for good: applies events as they come (coalescing bursts), and
   * reconnects with backoff; a dropped connection is never a cancel. */
  async start(): Promise<void> {
    if (this.following || !(await this.mirror.identity())) return;
    const stop = new AbortController();
    this.following = stop;
    const options: BackoffOptions = { startingDelay: 500, maxDelay: 30_000, jitter: "full", numOfAttempts: Number.MAX_SAFE_INTEGER, retry: () => !stop.signal.aborted };
    const once = async () => {
      await this.syncOnce();
      const token = await this.token();
      let batch: Event[] = [];
      let timer: number | null = null;
      const flush = async () => {
        timer = null;
        const events = batch;
        batch = [];
        if (!events.length) return;
        await this.mirror.applyEvents(events);
        if (events.some((e) => e.kind === "decision.requested")) await this.fetchedReceipts(token);
        this.health = { ...this.health, lastSyncAt: Date.now() };
        this.mirrorChanged.emit({});
        this.statusChanged.emit({});
      };
      this.health = { ...this.health, connected: true, reachable: true, reconnectingSince: null };
      this.statusChanged.emit({});
      for (;;) {
        try {
          await this.api.events(token, (await this.mirror.cursor()) ?? 0, (e) => {
            batch.push(e);
            if (timer === null) timer = window.setTimeout(() => void flush(), 50);
          }, stop.signal);
        } catch (e) {
          if (!(e instanceof ApiError && e.kind === "cursor_expired")) throw e;
          // Behind the server's retention: a fresh snapshot, then the stream from its cursor.
          if (timer !== null) window.clearTimeout(timer);
          batch = [];
          await this.resnapshot(token);
          this.mirrorChanged.emit({});
          continue;
        } finally {
          if (timer !== null) window.clearTimeout(timer);
          await flush();
        }
        break;
      }
      if (!stop.signal.aborted) throw new ApiError("unreachable", "the server closed the event stream");
    };
    void backOff(async () => {
      try {
        await once();
      } catch (e) {
        if (!stop.signal.aborted) this.failed(e);
        throw e;
      }
    }, options).catch(() => {});
  }

  /** Stops following (tests, and pairing again). */
  stop(): void {
    this.following?.abort();
    this.following = null;
  }

  private async signAndQueue(taskId: string, operation: Operation, args: Record<string, unknown> | null, scope: string[], seenRevision: number): Promise<OutboxView> {
    const id = await this.identity();
    if (seenRevision < 1) throw new Error(`plan revision ${seenRevision} was never shown: revisions start at 1`);
    const cmd = newCommand({ taskId, operation, args, scope, expectedPlanRevision: seenRevision, user: id.user, deviceId: id.device_id });
    const env = await signCommand(await this.deviceKey(), cmd);
    await this.mirror.enqueue(taskId, operation, seenRevision, cmd.command_id, env);
    this.mirrorChanged.emit({});
    try {
      await this.deliverOutbox();
    } catch (e) {
      // Offline: it stays queued, signed with what the person saw, and goes on the next sync.
      this.failed(e);
    }
    this.statusChanged.emit({});
    const entry = (await this.mirror.outbox(taskId)).find((e) => e.command_id === cmd.command_id);
    if (!entry) throw new Error("the command vanished from the outbox");
    return outboxView(entry);
  }

  /** The user's machines, live from the server (a machine's state is only worth its freshness). */
  async machines(): Promise<MachineView[]> {
    const list = await this.api.get<MachineList>(await this.token(), "/v1/machines");
    return list.machines.map(machineView);
  }

  /** Signs `start_run` for a new task whose id this device chooses (a resend is the same
   * command, applied once) and delivers it — or keeps it queued for the next sync. */
  async startRun(run: StartRunView): Promise<StartedRunView> {
    const id = await this.identity();
    const blank = (s: string | null) => (s && s.trim() ? s : null);
    if (!run.prompt.trim()) throw new Error("the prompt is empty: say what the run should do");
    const args: Record<string, unknown> = { machine: run.machine, runtime: run.runtime, directory: run.directory, prompt: run.prompt };
    const title = blank(run.title);
    const gate = blank(run.gate);
    if (title) args.title = title;
    if (gate) args.gate = gate;
    if (run.plan) args.plan = true;
    const taskId = `task_${commandId().replaceAll("-", "")}`;
    const cmd = newCommand({ taskId, operation: "start_run", args, expectedPlanRevision: null, user: id.user, deviceId: id.device_id });
    const env = await signCommand(await this.deviceKey(), cmd);
    await this.mirror.enqueue(taskId, "start_run", null, cmd.command_id, env);
    this.mirrorChanged.emit({});
    try {
      await this.deliverOutbox();
    } catch (e) {
      this.failed(e);
    }
    this.statusChanged.emit({});
    const entry = (await this.mirror.outbox(taskId)).find((e) => e.command_id === cmd.command_id);
    if (!entry) throw new Error("the command vanished from the outbox");
    return { task_id: taskId, command: outboxView(entry) };
  }

  /** This user's rules, newest first (live from the server: live, revoked and expired), and the
   * runtimes' own rules on their machines. */
  async rules(): Promise<RulesView> {
    const list = await this.api.get<RuleList>(await this.token(), "/v1/rules");
    return rulesView(list);
  }

  /** Signs a rule command (no task) and sends it at once — as `Companion::add_rule`, never
   * queued: offline, nothing is made and the person signs it again later. The server's words,
   * or its refusal as an error. */
  private async ruleCommand(operation: Operation, args: Record<string, unknown>): Promise<string> {
    const id = await this.identity();
    const cmd = newCommand({ taskId: null, operation, args, expectedPlanRevision: null, user: id.user, deviceId: id.device_id });
    const env = await signCommand(await this.deviceKey(), cmd);
    let res: CommandResult;
    try {
      res = await this.api.submit(env);
    } catch (e) {
      if (e instanceof ApiError && e.kind === "unreachable") throw new ApiError("unreachable", `${e.message}; no rule was changed — sign it again once the server can be reached`);
      throw e;
    }
    const effective = res.status === "duplicate" && res.original ? res.original : res;
    if (effective.status !== "applied" && effective.status !== "duplicate") throw new Error(effective.detail);
    return effective.detail;
  }

  async addRule(rule: NewRuleView): Promise<RuleAddedView> {
    const args = await addRuleArgs(rule);
    const detail = await this.ruleCommand("add_rule", args);
    return { rule_id: args.rule_id as string, detail };
  }

  async revokeRule(ruleId: string): Promise<string> {
    return this.ruleCommand("revoke_rule", { rule_id: ruleId });
  }

  async steer(taskId: string, op: SteerOp, instructions: string | null, suspend: string[], seenRevision: number): Promise<OutboxView> {
    const operation: Operation = op === "replan" && suspend.length ? "suspend_and_replan" : op;
    return this.signAndQueue(taskId, operation, instructions ? { instructions } : {}, suspend, seenRevision);
  }

  async decide(decisionId: string, op: DecideOp, option: string | null, text: string | null, seen: SeenView): Promise<OutboxView> {
    const d = await this.mirror.decision(decisionId);
    if (!d) throw new Error(`no decision \`${decisionId}\` in the mirror — sync first`);
    const operation: Operation = op === "approve" ? "approve" : op === "deny" ? "deny" : op === "wait" ? "defer" : op === "choose" ? "choose_option" : "answer_question";
    const s: Seen = { plan_revision: seen.plan_revision, intent_digest: seen.intent_digest ?? null };
    const a = answerArgs(d, operation, option, text, s);
    return this.signAndQueue(d.task_id, a.operation, a.args, [], s.plan_revision);
  }

  async approveEdited(decisionId: string, editedPart: string, seen: SeenView): Promise<OutboxView> {
    const d = await this.mirror.decision(decisionId);
    if (!d) throw new Error(`no decision \`${decisionId}\` in the mirror — sync first`);
    let part: unknown;
    try {
      part = JSON.parse(editedPart);
    } catch (e) {
      throw new Error(`the edit is not JSON: ${(e as Error).message}`);
    }
    const s: Seen = { plan_revision: seen.plan_revision, intent_digest: seen.intent_digest ?? null };
    const args = await approveEditedArgs({ id: d.id, intent: d.intent, editable: d.editable ?? null }, part, s);
    return this.signAndQueue(d.task_id, "approve", args, [], s.plan_revision);
  }

  async status(): Promise<StatusView> {
    const id = await this.mirror.identity();
    const outbox = await this.mirror.outbox(null);
    const inbox = await this.mirror.inbox();
    return {
      mode: "remote",
      paired: id !== null,
      server: id?.server ?? null,
      device_id: id?.device_id ?? null,
      user: id?.user ?? null,
      scopes: id?.scopes ?? [],
      connected: this.health.connected,
      server_reachable: this.health.reachable,
      last_sync_at: this.health.lastSyncAt,
      last_event_at: await this.mirror.lastEventAt(),
      reconnecting_since: this.health.reconnectingSince,
      last_error: this.health.lastError,
      queued: outbox.filter((e) => e.status === "queued").length,
      pending_decisions: inbox.length,
      muted_until: null,
      demo: null,
      keystore: this.db.persistent ? "this browser (WebCrypto key, not extractable; mirror in OPFS)" : `this browser (WebCrypto key, not extractable; no offline copy: ${this.db.fallbackReason ?? "OPFS is missing"})`,
    } as StatusView;
  }

  /** Whether this browser is set up to be notified (a push subscription registered with the
   * server), and whether it could be. */
  async pushState(): Promise<"on" | "off" | "denied" | "unsupported"> {
    if (!("serviceWorker" in navigator) || !("PushManager" in window) || !("Notification" in window)) return "unsupported";
    if (Notification.permission === "denied") return "denied";
    const reg = await navigator.serviceWorker.getRegistration();
    const sub = await reg?.pushManager.getSubscription();
    return sub ? "on" : "off";
  }

  /** Asks to notify (a person's tap must lead here), subscribes with the server's VAPID key and
   * registers the subscription as this device's Web Push channel. Pushes carry no content; the
   * service worker fetches what to show over this device's read session. */
  async enablePush(): Promise<void> {
    const state = await this.pushState();
    if (state === "unsupported") throw new Error("this browser cannot receive pushes (on iPhone and iPad: add Waymark to the Home Screen first)");
    if ((await Notification.requestPermission()) !== "granted") throw new Error("notifications are blocked for this site; allow them in the browser's site settings");
    const id = await this.identity();
    const { public_key } = await this.api.get<VapidKey>("", "/v1/push/vapid");
    const reg = await navigator.serviceWorker.ready;
    const sub = (await reg.pushManager.getSubscription()) ?? (await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: fromBase64url(public_key) }));
    const json = sub.toJSON();
    await this.api.post(await this.token(), `/v1/devices/${encodeURIComponent(id.device_id)}/push`, { kind: "web_push", endpoint: json.endpoint, keys: { p256dh: json.keys?.p256dh, auth: json.keys?.auth } });
    this.statusChanged.emit({});
  }

  async threads(): Promise<ThreadRowView[]> {
    const me = (await this.mirror.identity())?.user ?? null;
    return (await this.mirror.threads()).map((r) => threadRowView(r, Date.now(), me));
  }

  async thread(taskId: string): Promise<ThreadDetailView> {
    const d = await this.mirror.thread(taskId);
    if (!d) throw new Error(`no thread \`${taskId}\` in the mirror`);
    return threadDetailView(d);
  }

  async inbox(): Promise<InboxItemView[]> {
    const me = (await this.mirror.identity())?.user ?? null;
    return (await this.mirror.inbox()).map((i) => inboxItemView(i, me));
  }

  async outbox(): Promise<OutboxView[]> {
    return (await this.mirror.outbox(null)).map(outboxView);
  }

  /** This user's escalation policy, or none (every device is notified at once). */
  async escalation(): Promise<EscalationPolicyView | null> {
    try {
      return policyView(await this.api.get<EscalationPolicy>(await this.token(), "/v1/escalation"));
    } catch (e) {
      if ((e as ApiError).code === "not_found") return null;
      throw e;
    }
  }

  /** Sets this user's escalation policy (the server checks it); null removes it. */
  async setEscalation(policy: EscalationPolicyView | null): Promise<EscalationPolicyView | null> {
    const token = await this.token();
    if (policy) return policyView(await this.api.put<EscalationPolicy>(token, "/v1/escalation", policy));
    try {
      await this.api.delete(token, "/v1/escalation");
    } catch (e) {
      if ((e as ApiError).code !== "not_found") throw e;
    }
    return null;
  }

  /** Who may answer this user's decisions, and whose this user may answer. */
  async delegates(): Promise<DelegatesView> {
    return delegatesView(await this.api.get<Delegates>(await this.token(), "/v1/delegates"));
  }

  /** Offers `user` to read this user's tasks and answer their decisions once they accept
   * (`add`), or ends it. */
  async setDelegate(user: string, add: boolean): Promise<DelegatesView> {
    const token = await this.token();
    const path = `/v1/delegates/${encodeURIComponent(user.trim())}`;
    if (add) return delegatesView(await this.api.put<Delegates>(token, path, null));
    await this.api.delete(token, path);
    return this.delegates();
  }

  /** This user (the delegate) accepts `owner`'s offer (`accept`), or declines it — or leaves one
   * accepted before. Accepted, the mirror takes a fresh snapshot: the owner's earlier tasks are
   * behind its cursor, and the event stream brings only what happens next. */
  async answerDelegation(owner: string, accept: boolean): Promise<DelegatesView> {
    const token = await this.token();
    const path = `/v1/delegations/${encodeURIComponent(owner.trim())}/${accept ? "accept" : "decline"}`;
    const d = delegatesView(await this.api.post<Delegates>(token, path, null));
    if (accept) {
      await this.resnapshot(token);
      this.mirrorChanged.emit({});
    }
    return d;
  }

  /** This user's devices as the server lists them (last heard from, stale); offline, this
   * browser alone. */
  async devices(): Promise<DeviceView[]> {
    const id = await this.mirror.identity();
    if (!id) return [];
    try {
      const list = await this.api.get<Device[]>(await this.token(), "/v1/devices");
      return list.map((d) => ({
        id: d.id,
        name: d.name,
        user: d.user,
        scopes: d.scopes,
        created_at: Date.parse(d.created_at),
        revoked_at: d.revoked_at ? Date.parse(d.revoked_at) : null,
        last_seen_at: d.last_seen_at ? Date.parse(d.last_seen_at) : null,
        stale: d.stale,
        this_device: d.id === id.device_id,
      }));
    } catch {
      return [{ id: id.device_id, name: "this browser", user: id.user, scopes: id.scopes, created_at: null, revoked_at: null, last_seen_at: null, stale: false, this_device: true }];
    }
  }

  async markOpened(decisionIds: string[]): Promise<number> {
    return this.reportReceipts(decisionIds, "opened");
  }

  async artifactText(sha256: string): Promise<ArtifactText> {
    let bytes = await this.mirror.blob(sha256);
    if (!bytes) {
      bytes = await this.api.blob(await this.token(), sha256);
      await this.mirror.putBlob(sha256, bytes, 64 << 20);
    }
    const limit = 2 << 20;
    const text = new TextDecoder().decode(bytes.subarray(0, limit));
    return { text, size: bytes.length, truncated: bytes.length > limit } as ArtifactText;
  }
}

function apiBase(): string {
  // The page is served at `<server>/app/`; the API is the same origin's `/v1/…`.
  return "";
}

function defaultName(): string {
  const ua = navigator.userAgent;
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "macOS" : /Linux/.test(ua) ? "Linux" : "a browser";
  return `web companion on ${os}`;
}

function fromBase64url(s: string): Uint8Array<ArrayBuffer> {
  const b64 = s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4);
  const bin = atob(b64);
  const out = new Uint8Array(new ArrayBuffer(bin.length));
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function delegatesView(d: Delegates): DelegatesView {
  const view = (v: Delegation[]) =>
    v.map((x) => ({ user: x.user, since: Date.parse(x.since), state: x.state, accepted_at: x.accepted_at ? Date.parse(x.accepted_at) : null }));
  return { user: d.user, delegates: view(d.delegates), delegated_by: view(d.delegated_by) };
}

/** A policy as the editor holds it: the server leaves out absent quiet hours and reminders and a
 * step's empty `people`. */
function policyView(p: EscalationPolicy): EscalationPolicyView {
  return { quiet_hours: p.quiet_hours ?? null, reminders: p.reminders ?? null, steps: p.steps.map((s) => ({ after_minutes: s.after_minutes, devices: s.devices, people: s.people ?? [] })) };
}
