package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseTenants(t *testing.T) {
	tests := []struct {
		spec    string
		want    []weighted
		wantErr bool
	}{
		{spec: "acme:5,globex, trial:2", want: []weighted{{"acme", 5}, {"globex", 1}, {"trial", 2}}},
		{spec: "solo", want: []weighted{{"solo", 1}}},
		{spec: "acme:0", wantErr: true},
		{spec: "acme:x", wantErr: true},
		{spec: ":3", wantErr: true},
		{spec: " , ", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := parseTenants(tt.spec)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseTenants(%q) error: got %v, want error %v", tt.spec, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parseTenants(%q) (-want +got):\n%s", tt.spec, diff)
			}
		})
	}
}

func TestPick(t *testing.T) {
	ts := []weighted{{"a", 2}, {"b", 1}, {"c", 3}}
	want := []string{"a", "a", "b", "c", "c", "c"}
	for r, w := range want {
		if got := pick(ts, r); got != w {
			t.Errorf("pick(%d): got %q, want %q", r, got, w)
		}
	}
}
