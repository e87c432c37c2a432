"""The staff dashboard: admin pages over a store alias's brokers (health, topics, consumer groups, message
lookup, throughput and lag charts). See ``admin`` for how it is mounted; static files under
``static/rmq_eventstore/`` (no CDN), templates under ``templates/rmq_eventstore/dashboard/``."""
