package lua

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// Every file under admit/ is a part of Admit, and Admit is the parts as
// they are on disk, joined in AdmitParts' order.
func TestAdmitIsItsParts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("admit", "*.lua"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	sorted := slices.Clone(AdmitParts)
	slices.Sort(sorted)
	if !slices.Equal(names, sorted) {
		t.Fatalf("parts on disk %v, want the parts joined %v", names, sorted)
	}
	var want strings.Builder
	for _, n := range AdmitParts {
		b, err := os.ReadFile(filepath.Join("admit", n))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "-- ") {
			t.Errorf("%s: does not start with its contract (a comment)", n)
		}
		want.WriteString(strings.TrimRight(string(b), "\n") + "\n")
	}
	if Admit != want.String() {
		t.Errorf("Admit is not its parts joined in order (%d bytes, want %d)", len(Admit), want.Len())
	}
}

// What Redis loads is the joined script: SCRIPT LOAD answers the SHA1 of
// the parts joined, which is what the limiter's EVALSHA sends.
func TestAdmitLoadsAsJoined(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	sum := sha1.Sum([]byte(Admit))
	sha, err := rdb.ScriptLoad(context.Background(), Admit).Result()
	if err != nil {
		t.Fatalf("SCRIPT LOAD of the joined script: %v", err)
	}
	if want := hex.EncodeToString(sum[:]); sha != want {
		t.Errorf("SCRIPT LOAD: got sha %s, want %s (the joined parts)", sha, want)
	}
}
