from django.urls import path

from . import views

app_name = "startup"

urlpatterns = [
    path("", views.script_list, name="list"),
    path("<slug:lifecycle>/<slug:role>/", views.script_edit, name="edit"),
    path("<slug:lifecycle>/<slug:role>/versions/", views.script_versions, name="versions"),
    path("<slug:lifecycle>/<slug:role>/versions/<int:number>/roll-back/",
         views.script_roll_back, name="roll_back"),
]
