"""The RabbitMQ store: the store and its AMQP session.

The driver is imported when a store is made, not here.
"""

from beatless.stores.rabbitmq.store import RabbitMQStore

__all__ = ["RabbitMQStore"]
