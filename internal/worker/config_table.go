package worker

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"
)

// configTableFormat renders Config as the README's markdown table of
// variables. The default column shows, in this order: the `default` tag,
// the `doc_default` tag (a default derived from other variables), "required
// <doc_required>", "required", or "none". The bounds column holds a
// placeholder per variable that ConfigTable fills from boundsText, the
// bounds Validate checks.
const configTableFormat = `| Variable | Type | Default | Bounds | Description |
|---|---|---|---|---|
{{range .}}| ` + "`{{usage_key .}}`" + ` | {{usage_type .}} | ` +
	`{{if usage_default .}}` + "`{{usage_default .}}`" +
	`{{else if .Tags.Get "doc_default"}}` + "`{{.Tags.Get \"doc_default\"}}`" +
	`{{else if .Tags.Get "doc_required"}}required {{.Tags.Get "doc_required"}}` +
	`{{else if usage_required .}}required` +
	`{{else}}none{{end}} | ` + boundsMark + `{{usage_key .}}` + boundsMark + ` | {{usage_description .}} |
{{end}}`

// boundsMark encloses a variable's name where its bounds go in the table.
const boundsMark = "\x00"

// ConfigTable returns the markdown table of every configuration variable,
// generated from Config's tags by envconfig.Usagef. `gatekeeper
// config-table` prints it for the README, and TestREADMEConfigTable keeps
// the README in step.
func ConfigTable() (string, error) {
	var buf bytes.Buffer
	if err := envconfig.Usagef(EnvPrefix, &Config{}, &buf, configTableFormat); err != nil {
		return "", fmt.Errorf("config table: %w", err)
	}
	parts := strings.Split(buf.String(), boundsMark)
	for i := 1; i < len(parts); i += 2 {
		parts[i] = boundsText(strings.TrimPrefix(parts[i], EnvPrefix+"_"))
	}
	return strings.Join(parts, ""), nil
}

// configListFormat is the variable list of `gatekeeper help`.
const configListFormat = `VARIABLE	DEFAULT	DESCRIPTION
{{range .}}{{usage_key .}}	` +
	`{{if usage_default .}}{{usage_default .}}` +
	`{{else if .Tags.Get "doc_default"}}{{.Tags.Get "doc_default"}}` +
	`{{else if usage_required .}}(required){{else if .Tags.Get "doc_required"}}(required {{.Tags.Get "doc_required"}}){{end}}	{{usage_description .}}
{{end}}`

// WriteConfigList writes the variables as an aligned plain-text table.
func WriteConfigList(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	if err := envconfig.Usagef(EnvPrefix, &Config{}, tw, configListFormat); err != nil {
		return err
	}
	return tw.Flush()
}
