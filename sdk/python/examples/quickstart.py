# The Python SDK in one screen, against the README's dsecd (scripts/dev run)
# with the README's py311 image:
#   PYTHONPATH=build/python python3 sdk/python/examples/quickstart.py
import asyncio, dsec
client = dsec.Client("127.0.0.1:7400")
r = client.run(["python3", "-c", "print(6*7)"], kind="fncall", timeout=2)
assert r.stdout == b"42\n" and r.exit_code == 0 and r.verdict == "ok"
with client.create(kind="container", image="py311") as sb:       # destroyed on exit
    sb.write_file("/work/a.py", "print('hi')")
    print(sb.exec("python3 /work/a.py").stdout)
    for chunk in sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.1; done"]):
        print(chunk.data)
s = client.open_session("job1/p0/s0", kind="container", image="py311")
s.step(0, "echo x >> log; wc -l < log")                          # run once, logged; replayed from the log
async def main():
    async with dsec.AsyncClient() as c:                           # asyncio: thousands of rollouts, one thread
        rs = await asyncio.gather(*(c.run(["/bin/true"]) for _ in range(1000)))
asyncio.run(main())
