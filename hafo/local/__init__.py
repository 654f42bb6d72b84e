"""Run a whole hafo cluster on one machine: embedded etcd, controllers, agents."""
