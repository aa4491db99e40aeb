"""Calls to the Kubernetes API that the reconciler makes, run on a thread pool so they overlap.

The official client is synchronous; a pool of threads with a matching connection pool lets
hundreds of pod creations be in flight at once instead of one API call after another.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract import api, kubeclient
from ddp_operator import metrics

T = TypeVar("T")
CONCURRENCY = 32  # calls in flight for children (pods, services, ...)
STATUS_CONCURRENCY = 32  # and, apart, for status patches and Events


def make_api_client(kubeconfig: str | None = None, watches: int = 0) -> client.ApiClient:
    """The operator's client: in the cluster its service account, else the kubeconfig; a connection per call in
    flight and per watch it holds open (a pool too small closes connections that the next calls open again, with
    a TLS handshake each); every request counted (metrics.API_REQUESTS), the watches' and the lease's included."""
    return measured(kubeclient.api_client(kubeconfig, pool_size=CONCURRENCY + STATUS_CONCURRENCY + watches))


def measured(api_client: client.ApiClient) -> client.ApiClient:
    """Counts each request the client sends, by verb, resource and status code, where all of them pass."""
    request = api_client.request

    def counted(method: str, url: str, query_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        path = urlsplit(url).path
        try:
            response = request(method, url, query_params, *args, **kwargs)
        except ApiException as error:
            metrics.api_request(method, path, query_params, error.status or 0)
            raise
        except Exception:
            metrics.api_request(method, path, query_params, 0)
            raise
        metrics.api_request(method, path, query_params, response.status)
        return response

    api_client.request = counted
    return api_client


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(child: dict[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    child["metadata"]["ownerReferences"] = [owner_reference(job)]
    return child


class KubeApi:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="kube-api")
        # Status has its own threads: a job that just became Running must not wait behind the
        # hundreds of pod creations other jobs have queued.
        self._status_pool = ThreadPoolExecutor(max_workers=STATUS_CONCURRENCY, thread_name_prefix="kube-status")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def call_status(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._status_pool, functools.partial(fn, *args, **kwargs))

    async def send(self, fn: Callable[..., Any], *args: Any, status: bool = False, **kwargs: Any) -> None:
        """A call whose answer is not needed: the body is not turned into the client's models."""
        loop = asyncio.get_running_loop()
        pool = self._status_pool if status else self._pool
        await loop.run_in_executor(pool, functools.partial(discard_answer, fn, *args, **kwargs))

    async def delete_pod(self, namespace: str, name: str, uid: str, force: bool = False) -> None:
        """Deletes the pod with this name only while it is still the one with this uid.

        A decision to delete is taken from a cached view and carried out later (behind other
        calls in the pool); by then the name may belong to the next attempt's pod. The uid
        precondition makes such a late call fail (409) instead of deleting the new pod.
        force: grace period 0, the pod object goes at once without its kubelet's word (a lost node's).
        """
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                         grace_period_seconds=0 if force else None)
        try:
            await self.send(self.core.delete_namespaced_pod, name, namespace, body=options)
        except ApiException as error:
            if error.status not in (404, 409):
                raise
            return
        metrics.PODS_DELETED.labels(str(force).lower()).inc()

    async def ensure(self, obj: dict[str, Any], calls: tuple[Callable[..., Any], Callable[..., Any]] | None = None
                     ) -> Mapping[str, Any] | None:
        """Creates a namespaced Pod, Service, ServiceAccount, Role or RoleBinding (another kind: its
        create and read `calls`) unless its name is taken; then returns the metadata of the object
        that holds it (an earlier pass's, or a stranger's)."""
        create, read = calls or {
            "Pod": (self.core.create_namespaced_pod, self.core.read_namespaced_pod),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "ServiceAccount": (self.core.create_namespaced_service_account, self.core.read_namespaced_service_account),
            "Role": (self.rbac.create_namespaced_role, self.rbac.read_namespaced_role),
            "RoleBinding": (self.rbac.create_namespaced_role_binding, self.rbac.read_namespaced_role_binding),
        }[obj["kind"]]
        namespace = obj["metadata"]["namespace"]
        refused: ApiException | None = None
        try:
            await self.send(create, namespace, obj)
            if obj["kind"] == "Pod":
                metrics.PODS_CREATED.inc()
            return None
        except ApiException as error:
            if error.status not in (403, 409):
                raise
            # Admission (a full quota, Pod Security) judges a create before the name is found taken:
            # creating an object that exists is then refused (403), not a conflict (409).
            refused = error if error.status == 403 else None
        try:
            response = await self.call(read, obj["metadata"]["name"], namespace, _preload_content=False)
        except ApiException as error:
            if refused is not None:
                raise refused from None
            if error.status == 404:  # gone again since: the next pass creates it
                return None
            raise
        metadata: Mapping[str, Any] = json.loads(response.data).get("metadata") or {}
        return metadata

    async def create_secret(self, obj: dict[str, Any]) -> bool:
        """Creates a Secret unless its name is taken (True: created). Never reads one: the operator may
        create Secrets, not read them."""
        try:
            await self.send(self.core.create_namespaced_secret, obj["metadata"]["namespace"], obj)
        except ApiException as error:
            if error.status != 409:
                raise
            return False
        return True

    async def list_objects(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        """A namespace's ResourceQuotas or LimitRanges, as the API server's JSON (camelCase keys)."""
        listing = {"ResourceQuota": self.core.list_namespaced_resource_quota,
                   "LimitRange": self.core.list_namespaced_limit_range}[kind]
        response = await self.call(listing, namespace, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return items

    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        return await self.call_status(
            self.custom.patch_namespaced_custom_object_status,
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status},
        )

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self.call(
                self.custom.delete_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                propagation_policy="Background",
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._status_pool.shutdown(wait=False, cancel_futures=True)
        self.api.close()


async def ensure_each(ensure: Callable[[dict[str, Any]], Awaitable[Mapping[str, Any] | None]], indices: Sequence[int],
                      build: Callable[[int], dict[str, Any]]) -> list[Mapping[str, Any] | None | BaseException]:
    """`ensure(build(i))` (KubeApi.ensure) for each of `indices`, CONCURRENCY at a time, each object built only
    when its call is about to go: the manifests of a 10,000-pod gang are never all in memory, nor 10,000 calls
    queued. The answers in the order of `indices`, an error in the place of its object's answer."""
    results: list[Mapping[str, Any] | None | BaseException] = [None] * len(indices)
    todo = iter(enumerate(indices))

    async def worker() -> None:
        for at, index in todo:  # one iterator for every worker: each takes the next index
            try:
                results[at] = await ensure(build(index))
            except Exception as error:  # noqa: BLE001  (the caller judges each answer)
                results[at] = error

    await asyncio.gather(*(worker() for _ in range(min(CONCURRENCY, len(indices)))))
    return results


def is_controlled_by(meta: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether the object's controlling owner is this job (this uid: a job deleted and created again
    under the same name does not own its predecessor's objects)."""
    uid = job["metadata"]["uid"]
    for ref in meta.get("ownerReferences") or ():  # a loop, not any(): read for every pod of a gang each pass
        if ref.get("controller") and ref.get("uid") == uid:
            return True
    return False


def discard_answer(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Calls fn for its effect and hands the connection back to the pool for the next call.

    An answer taken unparsed (_preload_content=False) keeps its connection until it is read:
    dropped unread, every call opened a new TLS connection, which cost the operator and the API
    server more CPU than the calls themselves during a gang restart.
    """
    response = fn(*args, _preload_content=False, **kwargs)
    response.drain_conn()
    response.release_conn()


def is_going_away(error: ApiException) -> bool:
    """The job itself is gone (404 on a DDPJob) or its namespace is being deleted or gone: nothing to do.

    Any other error, a 404 about a child included, propagates so the work queue retries it.
    """
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        body = {}
    if error.status == 404:
        return (body.get("details") or {}).get("kind") in (api.PLURAL, "namespaces")
    return error.status == 403 and "NamespaceTerminating" in (error.body or "")


def api_message(error: ApiException) -> str:
    try:
        return json.loads(error.body).get("message", error.reason)
    except (TypeError, ValueError):
        return str(error.reason)
