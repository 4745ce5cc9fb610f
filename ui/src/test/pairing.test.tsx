// Pairing by a link that arrives (a scanned QR code): an unpaired device pairs at once; a
// paired one is asked first, since pairing again replaces its pairing. The shell is mocked.
import { describe, expect, it, vi } from "vitest";
import { render, screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { I18nProvider } from "../i18n";
import { PairingScreen } from "../screens/Pairing";
import { status } from "./fixtures";

const shell = vi.hoisted(() => ({ pairs: [] as string[] }));

vi.mock("../data", () => ({
  commands: {
    pairDevice: async (link: string) => {
      shell.pairs.push(link);
      return { paired: true, device_id: "dev_2", user: "alice", server: "http://127.0.0.1:7300" };
    },
    listDevices: async () => [],
    getDelegates: async () => ({ user: "alice", delegates: [], delegated_by: [] }),
    getEscalation: async () => null,
  },
  errorText: (e: unknown) => (e as Error).message,
  useMirror: () => ({ data: [], error: null, reload: () => {} }),
}));

const LINK = "http://127.0.0.1:7300/app/#/pair?code=ABCD-EFGH";

describe("a pairing link that arrives", () => {
  it("pairs an unpaired device at once", async () => {
    shell.pairs = [];
    render(
      <I18nProvider initial="en">
        <PairingScreen status={status({ paired: false, device_id: null, user: null })} initialLink={LINK} pairNow />
      </I18nProvider>,
    );
    await waitFor(() => expect(shell.pairs).toEqual([LINK]));
    expect(screen.queryByTestId("repair-ask")).toBeNull();
  });

  it("asks a paired device first, and keeps its pairing when told to", async () => {
    shell.pairs = [];
    let left = false;
    render(
      <I18nProvider initial="en">
        <PairingScreen status={status()} initialLink={LINK} pairNow done={() => (left = true)} />
      </I18nProvider>,
    );
    const ask = await screen.findByTestId("repair-ask");
    expect(ask.textContent).toContain("paired as dev_1 for alice");
    expect(shell.pairs).toEqual([]);
    await userEvent.click(screen.getByTestId("repair-no"));
    expect(shell.pairs).toEqual([]);
    expect(left).toBe(true);
  });

  it("pairs a paired device again once the person agrees", async () => {
    shell.pairs = [];
    render(
      <I18nProvider initial="en">
        <PairingScreen status={status()} initialLink={LINK} pairNow />
      </I18nProvider>,
    );
    await userEvent.click(await screen.findByTestId("repair-yes"));
    await waitFor(() => expect(shell.pairs).toEqual([LINK]));
  });
});
