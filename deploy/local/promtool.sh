#!/usr/bin/env bash
# promtool.sh ARGS...: runs promtool (Prometheus's rule and config checker) with ARGS,
# installing Debian's prometheus package first when promtool is missing. The tests of
# deploy/ call it for the alert rules and the dashboard's queries; a failed install is an
# error, never a skip.
set -euo pipefail
source "$(dirname "$0")/common.sh"

ensure_promtool_installed
exec promtool "$@"
