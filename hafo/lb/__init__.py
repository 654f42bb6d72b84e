"""Load balancers driven by hafo's endpoints: ``hafo lb haproxy`` puts a service's ready
replicas in rotation in a running HAProxy through its runtime API, the moment hafo learns of
a change (``hafo.lb.haproxy``; the pure slot assignment: ``hafo.lb.slots``; the runtime-API
client: ``hafo.lb.runtime``)."""
