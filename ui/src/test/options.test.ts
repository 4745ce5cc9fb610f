import { describe, expect, it } from "vitest";
import table from "../web/fixtures/option-grants.json";
import { optionGrants } from "../options";

describe("optionGrants", () => {
  it("answers every case of the table the server's option_grants is tested with", () => {
    expect(table.cases.length).toBeGreaterThan(10);
    for (const [option, grants] of table.cases as [string, boolean | null][]) {
      expect([option, optionGrants(option)]).toEqual([option, grants]);
    }
  });
});
