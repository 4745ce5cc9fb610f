-- Approvals a person may edit before approving: the JSON pointer (RFC 6901) of the part of the
-- intent the runtime takes changed (Claude Code's `updatedInput`); NULL where it takes none.
ALTER TABLE decisions ADD COLUMN editable TEXT;
