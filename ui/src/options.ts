// Whether an approval's option grants the call (`approve`, `approve_…`: true), refuses it
// (`deny`, `deny_…`: false) or is no approval option (`approvex`, `denylist`: null). A twin of
// `waymark_proto::option_grants`, kept in step by one case table both sides test
// (`web/fixtures/option-grants.json`).

export function optionGrants(option: string): boolean | null {
  if (option === "approve") return true;
  if (option === "deny") return false;
  if (option.length > "approve_".length && option.startsWith("approve_")) return true;
  if (option.length > "deny_".length && option.startsWith("deny_")) return false;
  return null;
}
