// The screens' calls (`commands`/`events`, the bindings' shape) served by the web companion,
// which is loaded only when first used: the desktop app, which never needs it, does not carry
// the mirror, the signer or SQLite in its bundle.
import type {
  DecideOp,
  EscalationPolicyView,
  MirrorChanged,
  Navigate,
  NewRuleView,
  SeenView,
  StatusChanged,
  StartRunView,
  SteerOp,
} from "../bindings";
import type { Listener, WebCompanion } from "./transport";

export function webTransport(open: () => Promise<WebCompanion>) {
  const call =
    <A extends unknown[], R>(f: (w: WebCompanion, ...a: A) => Promise<R>) =>
    async (...a: A): Promise<R> =>
      f(await open(), ...a);
  const commands = {
    listThreads: call((w) => w.threads()),
    getThread: call((w, taskId: string) => w.thread(taskId)),
    artifactText: call((w, sha256: string) => w.artifactText(sha256)),
    pinThread: call((w, taskId: string, pinned: boolean) => w.mirror.pin(taskId, pinned)),
    listInbox: call((w) => w.inbox()),
    decide: call((w, decisionId: string, op: DecideOp, option: string | null, text: string | null, seen: SeenView) => w.decide(decisionId, op, option, text, seen)),
    markOpened: call((w, decisionIds: string[]) => w.markOpened(decisionIds)),
    approveEdited: call((w, decisionId: string, editedPart: string, seen: SeenView) => w.approveEdited(decisionId, editedPart, seen)),
    steer: call((w, taskId: string, op: SteerOp, instructions: string | null, suspend: string[], seenRevision: number) => w.steer(taskId, op, instructions, suspend, seenRevision)),
    listOutbox: call((w) => w.outbox()),
    listMachines: call((w) => w.machines()),
    startRun: call((w, run: StartRunView) => w.startRun(run)),
    listRules: call((w) => w.rules()),
    addRule: call((w, rule: NewRuleView) => w.addRule(rule)),
    revokeRule: call((w, ruleId: string) => w.revokeRule(ruleId)),
    syncNow: call((w) => w.syncOnce()),
    pairDevice: call((w, link: string, code: string | null, name: string | null) => w.pair(link, code, name)),
    listDevices: call((w) => w.devices()),
    getEscalation: call((w) => w.escalation()),
    setEscalation: call((w, policy: EscalationPolicyView | null) => w.setEscalation(policy)),
    getDelegates: call((w) => w.delegates()),
    setDelegate: call((w, user: string, add: boolean) => w.setDelegate(user, add)),
    answerDelegation: call((w, owner: string, accept: boolean) => w.answerDelegation(owner, accept)),
    getStatus: call((w) => w.status()),
    // Muting is the desktop's (its own notifications); a browser's are the system's to mute.
    muteNotifications: call((w) => w.status()),
    startDemo: call(async () => {
      throw new Error("the demo runs in the desktop app; here, pair with a server that runs agents");
    }),
    takePendingRoute: call(async () => null as Navigate | null),
  };
  const events = {
    mirrorChanged: { listen: (f: Listener<MirrorChanged>) => open().then((w) => w.mirrorChanged.listen(f)) },
    statusChanged: { listen: (f: Listener<StatusChanged>) => open().then((w) => w.statusChanged.listen(f)) },
    navigate: { listen: (f: Listener<Navigate>) => open().then((w) => w.navigate.listen(f)) },
  };
  return { commands, events };
}
