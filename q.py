import permit

def do_work(token: int) -> None:                            # your code: pass it the token
    print("holding db.orders with fencing token", token)

client = permit.Client("http://127.0.0.1:7396")            # or a list of every node
with client.session(ttl=10.0) as session:                   # kept alive every ttl/3
    with session.acquire("db.orders", permits=2, capacity=4, timeout=30.0) as p:
        do_work(p.token)                                    # p.lost is set if the hold is lost
