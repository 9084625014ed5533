#!/bin/sh
# Renders the load-balancer config for N ikbo-serve replicas to stdout.
#
#   deploy/lb/render.sh haproxy|nginx [--listen ADDR] [--workers N] REPLICA... > FILE
#
# REPLICA is HOST:GRPC_PORT[:HTTP_PORT]: a replica's grpc_listen port and its
# http_listen port (default 8080; HAProxy health-checks /readyz there, nginx
# does not use it). --listen is where the balancer takes gRPC (default
# 0.0.0.0:50050); --workers is nginx's worker_processes (default auto).
#   haproxy: deploy/lb/haproxy.cfg.template    run: haproxy -f FILE -db
#   nginx:   deploy/lb/nginx.conf.template     run: nginx -p PREFIX -c FILE
#            (PREFIX holds logs/ and tmp/)
set -eu
here=$(dirname "$0")
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -gt 0 ] || { usage >&2; exit 2; }
kind=$1
shift
case "$kind" in
    haproxy) template=$here/haproxy.cfg.template ;;
    nginx) template=$here/nginx.conf.template ;;
    -h|--help) usage; exit 0 ;;
    *) echo "render.sh: first argument must be haproxy or nginx, not '$kind'" >&2; exit 2 ;;
esac
listen=0.0.0.0:50050
workers=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --listen) listen=$2; shift 2 ;;
        --listen=*) listen=${1#*=}; shift ;;
        --workers) workers=$2; shift 2 ;;
        --workers=*) workers=${1#*=}; shift ;;
        -*) echo "render.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "render.sh: give at least one replica HOST:GRPC_PORT[:HTTP_PORT]" >&2; exit 2; }
servers=""
i=0
for r in "$@"; do
    i=$((i + 1))
    host=${r%%:*}
    ports=${r#*:}
    grpc_port=${ports%%:*}
    http_port=8080
    [ "$ports" = "$grpc_port" ] || http_port=${ports#*:}
    for p in "$grpc_port" "$http_port"; do
        case "$p" in
            ''|*[!0-9]*) echo "render.sh: replica '$r' is not HOST:GRPC_PORT[:HTTP_PORT]" >&2; exit 2 ;;
        esac
    done
    if [ "$kind" = nginx ]; then
        line="        server $host:$grpc_port max_fails=1 fail_timeout=5s;"
    else
        line="    server replica$i $host:$grpc_port proto h2 check-proto h1 port $http_port"
    fi
    servers="$servers$line
"
done
# awk, not sed: the server lines would need escaping for sed.
awk -v listen="$listen" -v workers="$workers" -v servers="$servers" '
    $0 == "@SERVERS@" { printf "%s", servers; next }
    { gsub(/@LISTEN@/, listen); gsub(/@WORKERS@/, workers); print }
' "$template"
