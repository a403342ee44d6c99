#!/bin/sh
# The container's entrypoint: `wsd serve` on the volume by default, the
# health probe as `health`, any other wsd subcommand or program as given.
#
#   (no arguments) | -FLAG...  wsd serve --root $WSD_ROOT --listen $WSD_LISTEN [FLAGS]
#   health                     wsd status against $WSD_LISTEN (via loopback)
#   SUBCOMMAND ARGS...         wsd SUBCOMMAND ARGS... (serve, push, status, ...)
#   PROGRAM ARGS...            PROGRAM ARGS... (e.g. sh)
#
# A listener that is not loopback needs a token (WSD_TOKEN or
# WSD_TOKEN_FILE): without one the daemon admits loopback peers only, so
# every client outside the container would be refused; we fail early with
# that reason instead.
set -eu

WSD_BIN=${WSD_BIN:-wsd}
WSD_ROOT=${WSD_ROOT:-/workspace}
WSD_LISTEN=${WSD_LISTEN:-0.0.0.0:45678}

# The address a probe inside the container dials for $WSD_LISTEN.
probe_addr() {
  case $WSD_LISTEN in
    unix:*) printf '%s\n' "$WSD_LISTEN" ;;
    0.0.0.0:*) printf '127.0.0.1:%s\n' "${WSD_LISTEN#0.0.0.0:}" ;;
    '[::]:'*) printf '[::1]:%s\n' "${WSD_LISTEN#\[::\]:}" ;;
    *) printf '%s\n' "$WSD_LISTEN" ;;
  esac
}

serve() {
  case $WSD_LISTEN in
    unix:* | 127.* | localhost:* | '[::1]:'*) ;;
    *)
      if [ -z "${WSD_TOKEN:-}" ] && [ -z "${WSD_TOKEN_FILE:-}" ]; then
        echo "wsd-entrypoint: listening on $WSD_LISTEN needs a token: set WSD_TOKEN or WSD_TOKEN_FILE" >&2
        exit 64
      fi
      ;;
  esac
  exec "$WSD_BIN" serve --root "$WSD_ROOT" --listen "$WSD_LISTEN" "$@"
}

if [ $# -eq 0 ]; then
  serve
fi
case $1 in
  -*) serve "$@" ;;
  health)
    shift
    exec "$WSD_BIN" status --remote "$(probe_addr)" "$@"
    ;;
  serve | push | pull | sync | watermarks | status | exec | attach | kill | completions | man | help)
    exec "$WSD_BIN" "$@"
    ;;
  *) exec "$@" ;;
esac
