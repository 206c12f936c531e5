#!/usr/bin/env python3
"""deploy/local/drill-broker-outage.py: what an operator sees during a broker outage.

Starts PostgreSQL (unless DATABASE_URL is set) and an Apache Kafka broker (its own:
the drill kills it, so KAFKA_BROKERS is refused), a leading and a standby relay, a writer of
about 20 events/s and a Prometheus evaluating deploy/prometheus/alerts.yaml; SIGKILLs the
broker at T_STOP seconds (default 120) for OUTAGE seconds (default 480), restarts it, watches
AFTER seconds more (default 240). Every 15 s it prints the dashboard's key figures and the
alerts' states, and each change of the alerts. Needs `cargo build --bins` and
deploy/local/install-deps.sh. State and logs: target/drill (DRILL_DIR).
"""
import json, os, socket, subprocess, sys, time, urllib.request, urllib.parse, signal
REPO=os.path.abspath(os.path.join(os.path.dirname(__file__),'..','..'))
OUT=os.path.abspath(os.environ.get('DRILL_DIR', os.path.join(REPO,'target','drill')))
ST=os.path.join(OUT,'env')
if os.environ.get('KAFKA_BROKERS'):
    sys.exit('drill-broker-outage: it kills its own broker; unset KAFKA_BROKERS')
os.makedirs(OUT, exist_ok=True)
def free_port():
    with socket.socket() as so:
        so.bind(('127.0.0.1', 0)); return so.getsockname()[1]
RELAY_PORTS=(free_port(), free_port()); PROM_PORT=free_port()
T_STOP=int(os.environ.get('T_STOP','120')); OUTAGE=int(os.environ.get('OUTAGE','480')); AFTER=int(os.environ.get('AFTER','240'))
env=dict(os.environ)
def sh(cmd, **kw): return subprocess.run(cmd, shell=True, check=True, env=env, **kw)
sh(f'cd {REPO} && TOPICS="outbox.event.order" bash deploy/local/up.sh {ST} >{OUT}/up.log 2>&1')
for line in open(f'{ST}/env.sh'):
    line=line.strip()
    if line.startswith('export '):
        for kv in line[7:].split(' '):
            if '=' in kv:
                k,v=kv.split('=',1); env[k]=v.strip('"\'')
print('env', env['DATABASE_URL'], env['KAFKA_BROKERS'], flush=True)
relay=f'{REPO}/target/debug/outbox-relay'
sh(f'{relay} migrate >{OUT}/migrate.log 2>&1')
procs=[]
for i,port in enumerate(RELAY_PORTS):
    procs.append(subprocess.Popen([relay,'run','--metrics-addr',f'127.0.0.1:{port}','--instance-id',f'relay-{"ab"[i]}'],env=env,stdout=open(f'{OUT}/relay-{i}.log','w'),stderr=subprocess.STDOUT))
    time.sleep(1)
psql=f"{env['PG_BIN_DIR']}/psql"
writer=subprocess.Popen(['bash','-c',f'''while true; do {psql} "$DATABASE_URL" -qAt -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'order', 'o-'||(random()*50)::int, 'OrderPaid', '{{}}'::jsonb FROM generate_series(1,5)" >/dev/null 2>>{OUT}/writer.err; sleep 0.25; done'''],env=env)
prom_dir=f'{OUT}/prom'; os.makedirs(prom_dir,exist_ok=True)
open(f'{prom_dir}/prometheus.yml','w').write(f'''global: {{scrape_interval: 5s, evaluation_interval: 5s}}
rule_files: ["{REPO}/deploy/prometheus/alerts.yaml"]
scrape_configs:
  - job_name: outbox-relay
    static_configs:
      - targets: ["127.0.0.1:{RELAY_PORTS[0]}", "127.0.0.1:{RELAY_PORTS[1]}"]
        labels: {{database: order}}
''')
prom=subprocess.Popen(['prometheus',f'--config.file={prom_dir}/prometheus.yml',f'--storage.tsdb.path={prom_dir}/data',f'--web.listen-address=127.0.0.1:{PROM_PORT}'],stdout=open(f'{OUT}/prom.log','w'),stderr=subprocess.STDOUT)
def q(expr):
    try:
        u=f'http://127.0.0.1:{PROM_PORT}/api/v1/query?'+urllib.parse.urlencode({'query':expr})
        r=json.load(urllib.request.urlopen(u,timeout=5))['data']['result']
        vals={(x['metric'].get('reason') or x['metric'].get('instance') or ''):round(float(x['value'][1]),2) for x in r}
        return vals.get('', '-') if set(vals) <= {''} else vals
    except Exception as e: return f'ERR {e}'
def alerts():
    try:
        r=json.load(urllib.request.urlopen(f'http://127.0.0.1:{PROM_PORT}/api/v1/alerts',timeout=5))['data']['alerts']
        return sorted(f"{a['labels']['alertname']}:{a['state']}" for a in r)
    except Exception as e: return [f'ERR {e}']
Q={'backlog':'max(outbox_backlog_events)','oldest_s':'max(outbox_oldest_unpublished_age_seconds)',
   'pub_rate':'sum(rate(outbox_events_published_total[1m]))',
   'leader':'outbox_relay_leader','epoch':'max(outbox_relay_lease_epoch)','dberr':'sum(outbox_relay_database_errors_total)','failures':'sum by (reason) (rate(outbox_publish_failures_total[1m]))',
   'p99_ms':'1000*histogram_quantile(0.99, sum by (le) (rate(outbox_publish_latency_seconds_bucket[1m])))',
   'parked':'sum(outbox_parked_events)','retrying':'sum(outbox_retrying_events)','brokers_down':'max(outbox_kafka_brokers_down)'}
t0=time.time(); stopped=restarted=False; last_alerts=None
kafka_pid=lambda: open(f'{ST}/kafka.pid').read().strip()
try:
    while True:
        t=time.time()-t0
        if not stopped and t>=T_STOP:
            os.kill(int(kafka_pid()), signal.SIGKILL); stopped=True; print(f'== t={t:.0f}s broker SIGKILLed',flush=True)
        if stopped and not restarted and t>=T_STOP+OUTAGE:
            sh(f'cd {REPO} && TOPICS="outbox.event.order" bash deploy/local/up.sh {ST} >>{OUT}/up.log 2>&1'); restarted=True; print(f'== t={t:.0f}s broker restarted',flush=True)
        if t>=T_STOP+OUTAGE+AFTER: break
        vals={k:q(v) for k,v in Q.items()}; al=alerts()
        print(f't={t:4.0f}s '+' '.join(f'{k}={v}' for k,v in vals.items())+f' alerts={al}',flush=True)
        if al!=last_alerts: print(f'   ALERTS CHANGE t={t:.0f}s: {al}',flush=True); last_alerts=al
        time.sleep(15)
finally:
    writer.kill(); prom.terminate()
    for p in procs: p.terminate()
    for p in procs: p.wait()
    sh(f'cd {REPO} && bash deploy/local/down.sh {ST} >/dev/null 2>&1 || true')
