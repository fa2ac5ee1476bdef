import asyncio
import json
import os

import websockets

CODE = """
user = await get_user(id=123)
print(f"Hello, {user['name']}")
"""

USERS = {123: {"name": "Ada"}}


async def handle(name, args):
    """Run a callback for the sandbox; raise to send it an error"""
    if name == "get_user":
        return USERS[args["id"]]
    raise ValueError(f"Unknown callback {name}")


async def main():
    headers = {"Authorization": f"Bearer {os.environ['ERYX_API_KEY']}"}
    async with websockets.connect("wss://api.dev.eryx.run/v1/stream", additional_headers=headers) as ws:
        await ws.send(json.dumps({
            "type": "execute",
            "code": CODE,
            "callbacks": [{"name": "get_user", "description": "Look up a user by id"}],
        }))
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "callback":
                reply = {"type": "callback_response", "call_id": msg["call_id"]}
                try:
                    reply["result"] = await handle(msg["name"], msg["args"])
                except Exception as e:
                    reply["error"] = str(e)
                await ws.send(json.dumps(reply))
            elif msg["type"] == "completed":
                print(msg["status"], msg["stdout"], msg.get("error", ""))
                break
            elif msg["type"] == "error":
                raise RuntimeError(msg["message"])


asyncio.run(main())
