#!/bin/sh
# Real programs at work in a sandbox: run by compat.rs once under the default
# seccomp policy and once under --seccomp unconfined, in the Debian image of
# scripts/bootstrap-base.sh's compat set. Each check prints one line,
# `CHECK NAME ok` or `CHECK NAME FAIL: what it printed`, and the script
# always ends 0: the test compares the two runs check by check.
#
# It needs its own loopback (run with --net none): the TLS servers it starts
# listen on fixed ports of 127.0.0.1.
set -u
W=$(mktemp -d /tmp/compat.XXXXXX) || exit 1
cd "$W" || exit 1
export HOME="$W/home" LC_ALL=C.UTF-8 GOCACHE="$W/gocache" GOPATH="$W/go" GOFLAGS=-mod=mod
mkdir -p "$HOME"

# check NAME FUNCTION: runs FUNCTION, killed after 240 s (a hang is a
# failure of its own, not the end of the script).
check() {
    name=$1
    shift
    ("$@") >"$W/out.$name" 2>&1 &
    pid=$!
    (sleep 240 && kill -9 "$pid" 2>/dev/null && echo "(timed out after 240 s)" >>"$W/out.$name") &
    dog=$!
    if wait "$pid"; then
        echo "CHECK $name ok"
    else
        echo "CHECK $name FAIL: $(tail -n 5 "$W/out.$name" | tr '\n' '|')"
    fi
    kill "$dog" 2>/dev/null
}

# --- a CA of the test's own and a server certificate for localhost --------
tls_setup() {
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=compat-ca \
        -keyout ca.key -out ca.pem &&
        openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
            -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
            -keyout srv.key -out srv.csr &&
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext.cnf &&
        openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 2 -extfile ext.cnf -out srv.pem
}

openssl_rand() { test "$(openssl rand -hex 16 | wc -c)" -eq 33; }

# A TLS server of Python's (ssl + http.server) over a small PEP 503 index
# that holds one wheel made here.
index_setup() {
    mkdir -p srv/simple/compat-demo && python3 - <<'PY'
import base64, hashlib, zipfile
files = {
    "compat_demo/__init__.py": b"ANSWER = 42\n",
    "compat_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: compat-demo\nVersion: 1.0\n",
    "compat_demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: compat\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append("compat_demo-1.0.dist-info/RECORD,,")
with zipfile.ZipFile("srv/simple/compat-demo/compat_demo-1.0-py3-none-any.whl", "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
    z.writestr("compat_demo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
PY
}

serve() {
    cat >serve.py <<'PY'
import functools, http.server, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("srv.pem", "srv.key")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="srv")
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 8443), handler)
httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
print("ready", flush=True)
httpd.serve_forever()
PY
    echo hello-over-tls >srv/hello.txt
    python3 serve.py >serve.log 2>&1 &
    echo $! >server.pid
    i=0
    while ! grep -q ready serve.log 2>/dev/null; do
        i=$((i + 1))
        [ $i -gt 100 ] && return 1
        sleep 0.1
    done
}

curl_tls() { test "$(curl -sS --cacert ca.pem https://localhost:8443/hello.txt)" = hello-over-tls; }

python_ssl() {
    python3 -c '
import ssl, urllib.request
ctx = ssl.create_default_context(cafile="ca.pem")
body = urllib.request.urlopen("https://localhost:8443/hello.txt", context=ctx).read()
assert body == b"hello-over-tls\n", body
import secrets; assert len(secrets.token_bytes(32)) == 32
'
}

python_pip() {
    python3 -m venv venv &&
        venv/bin/pip install -q --disable-pip-version-check --no-cache-dir \
            --cert ca.pem --index-url https://localhost:8443/simple compat-demo &&
        test "$(venv/bin/python -c 'import compat_demo; print(compat_demo.ANSWER)')" = 42
}

python_mp() {
    # A file, not -c: spawn and forkserver children import the main module.
    cat >mp.py <<'PY'
import asyncio, multiprocessing as mp
def sq(x): return x * x
if __name__ == "__main__":
    for method in ("fork", "spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as p:
            assert p.map(sq, range(8)) == [x * x for x in range(8)], method
    q = mp.Queue(); pr = mp.Process(target=q.put, args=(7,)); pr.start(); assert q.get() == 7; pr.join()
    async def main():
        proc = await asyncio.create_subprocess_exec("echo", "hi", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        r, w = await asyncio.open_connection("127.0.0.1", 8443)
        w.close(); await w.wait_closed()
        return out
    assert asyncio.run(main()) == b"hi\n"
PY
    python3 mp.py
}

node_all() {
    cat >n.js <<'JS'
const crypto = require("crypto"), https = require("https"), fs = require("fs");
const { Worker } = require("worker_threads");
if (crypto.randomBytes(16).length !== 16) throw new Error("randomBytes");
crypto.createHash("sha256").update("x").digest("hex");
const w = new Worker("require('worker_threads').parentPort.postMessage(6 * 7)", { eval: true });
w.on("message", (v) => {
  if (v !== 42) throw new Error("worker");
  https.get("https://127.0.0.1:8443/hello.txt", { ca: fs.readFileSync("ca.pem") }, (res) => {
    let body = "";
    res.on("data", (d) => (body += d));
    res.on("end", () => {
      if (body !== "hello-over-tls\n") throw new Error("body " + body);
      console.log("node ok");
    });
  }).on("error", (e) => { console.error(e); process.exit(1); });
});
JS
    test "$(node n.js)" = "node ok"
}

git_work() {
    git config --global user.email c@example.invalid && git config --global user.name compat &&
        git init -q repo && echo one >repo/f && git -C repo add f && git -C repo commit -qm one &&
        git clone -q "file://$W/repo" clone && test "$(cat clone/f)" = one &&
        git -C clone log --oneline | grep -q one && git -C repo gc -q
}

ssh_keygen() { ssh-keygen -q -t ed25519 -N '' -f "$W/id_test" && ssh-keygen -l -f "$W/id_test.pub" >/dev/null; }

go_build() {
    mkdir -p gohello && cat >gohello/main.go <<'GO'
package main

import (
	"crypto/rand"
	"fmt"
	"os/exec"
	"sync"
)

func main() {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	sum := make([]int, 8)
	for i := range sum {
		wg.Add(1)
		go func(i int) { defer wg.Done(); sum[i] = i * i }(i)
	}
	wg.Wait()
	out, err := exec.Command("echo", "child").Output()
	if err != nil {
		panic(err)
	}
	fmt.Printf("go %d %s", sum[7], out)
}
GO
    (cd gohello && printf 'module gohello\n\ngo 1.19\n' >go.mod && go build -o hello . && test "$(./hello)" = "go 49 child")
}

rust_build() {
    cat >r.rs <<'RS'
use std::collections::HashMap;
fn main() {
    let mut m = HashMap::new(); // seeded from getrandom
    let handles: Vec<_> = (0..4).map(|i| std::thread::spawn(move || i * 10)).collect();
    for (i, h) in handles.into_iter().enumerate() { m.insert(i, h.join().unwrap()); }
    let out = std::process::Command::new("echo").arg("child").output().unwrap();
    print!("rust {} {}", m[&3], String::from_utf8_lossy(&out.stdout));
}
RS
    rustc -O -o rhello r.rs && test "$(./rhello)" = "rust 30 child"
}

java_run() {
    keytool -importcert -noprompt -alias compat -file ca.pem -keystore trust.p12 \
        -storetype PKCS12 -storepass changeit >/dev/null &&
        cat >Hello.java <<'JAVA'
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.security.SecureRandom;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class Hello {
    public static void main(String[] args) throws Exception {
        byte[] b = new byte[16];
        SecureRandom.getInstanceStrong().nextBytes(b);
        var pool = Executors.newFixedThreadPool(4);
        Future<Integer> f = pool.submit(() -> 6 * 7);
        int v = f.get();
        pool.shutdown();
        var resp = HttpClient.newHttpClient().send(
            HttpRequest.newBuilder(URI.create("https://localhost:8443/hello.txt")).build(),
            HttpResponse.BodyHandlers.ofString());
        System.out.print("java " + v + " " + resp.body());
    }
}
JAVA
    test "$(java -Djavax.net.ssl.trustStore=trust.p12 -Djavax.net.ssl.trustStorePassword=changeit Hello.java)" = "java 42 hello-over-tls"
}

c_make() {
    mkdir -p cproj && cat >cproj/main.c <<'C'
#include <pthread.h>
#include <stdio.h>
#include <sys/random.h>
static void *work(void *p) { *(int *)p *= 2; return p; }
int main(void) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != sizeof b) return 1;
    int v = 21; pthread_t t;
    pthread_create(&t, NULL, work, &v); pthread_join(t, NULL);
    printf("c %d\n", v);
    return 0;
}
C
    printf 'hello: main.c\n\tcc -O2 -g -pthread -o $@ main.c\n' >cproj/Makefile &&
        make -s -C cproj && test "$(cproj/hello)" = "c 42"
}

debuggers() {
    strace -f -o strace.log cproj/hello >/dev/null && grep -q getrandom strace.log &&
        gdb -q -batch -ex 'break work' -ex run -ex bt -ex continue cproj/hello 2>&1 | grep -q '^#0 .*work (p='
}

sqlite_db() {
    sqlite3 db.sqlite 'PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1),(2),(3);' >/dev/null &&
        test "$(sqlite3 db.sqlite 'SELECT sum(x) FROM t;')" = 6
}

check openssl-rand openssl_rand
check tls-setup tls_setup
check index-setup index_setup
check tls-server serve
check curl-tls curl_tls
check python-ssl python_ssl
check python-venv-pip python_pip
check python-multiprocessing-asyncio python_mp
check node-crypto-https-workers node_all
check git git_work
check ssh-keygen ssh_keygen
check go go_build
check rust rust_build
check java java_run
check gcc-make c_make
check strace-gdb debuggers
check sqlite sqlite_db
[ -s server.pid ] && kill "$(cat server.pid)" 2>/dev/null
cd / && rm -rf "$W"
exit 0
