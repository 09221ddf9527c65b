package worker

import (
	"bytes"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"
)

// configTableFormat renders Config as the README's markdown table of
// variables. The default column shows, in this order: the `default` tag,
// the `doc_default` tag (a default derived from other variables), "required
// <doc_required>", "required", or "none".
const configTableFormat = `| Variable | Type | Default | Description |
|---|---|---|---|
{{range .}}| ` + "`{{usage_key .}}`" + ` | {{usage_type .}} | ` +
	`{{if usage_default .}}` + "`{{usage_default .}}`" +
	`{{else if .Tags.Get "doc_default"}}` + "`{{.Tags.Get \"doc_default\"}}`" +
	`{{else if .Tags.Get "doc_required"}}required {{.Tags.Get "doc_required"}}` +
	`{{else if usage_required .}}required` +
	`{{else}}none{{end}} | {{usage_description .}} |
{{end}}`

// ConfigTable returns the markdown table of every configuration variable,
// generated from Config's tags by envconfig.Usagef. `gatekeeper
// config-table` prints it for the README, and TestREADMEConfigTable keeps
// the README in step.
func ConfigTable() (string, error) {
	var buf bytes.Buffer
	if err := envconfig.Usagef(EnvPrefix, &Config{}, &buf, configTableFormat); err != nil {
		return "", fmt.Errorf("config table: %w", err)
	}
	return buf.String(), nil
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
